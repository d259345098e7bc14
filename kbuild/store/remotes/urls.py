"""A remote's URL in messages: its password and secret query arguments never shown."""

from __future__ import annotations

from urllib.parse import parse_qsl, quote, unquote, urlencode, urlsplit, urlunsplit

_SECRET_PARAMS = ("password", "passwd", "pass", "pwd", "token", "secret", "key", "auth",
                  "credential", "signature", "sig")


def redact(url: str) -> str:
    """`url` without its password or secret query arguments (?password=, ?token=...)."""
    try:
        parts = urlsplit(url)
        password = parts.password
    except ValueError:
        return "<a malformed URL>"
    if password is not None:
        netloc = parts.netloc.rpartition("@")[2]
        user = f"{parts.username}:" if parts.username else ":"
        parts = parts._replace(netloc=f"{user}***@{netloc}")
    query = parse_qsl(parts.query, keep_blank_values=True)
    if any(_secret_param(k) for k, _ in query):
        parts = parts._replace(query=urlencode(
            [(k, "***" if _secret_param(k) else v) for k, v in query], safe="*:"))
    return urlunsplit(parts)


def _secret_param(name: str) -> bool:
    name = name.lower()
    return any(word in name for word in _SECRET_PARAMS) and name != "prefix"


def url_secrets(url: str) -> tuple:
    """The secret strings in `url` (password, secret query values), to scrub from messages."""
    try:
        parts = urlsplit(url)
        found = [parts.password] if parts.password else []
    except ValueError:
        return ()
    found += [v for k, v in parse_qsl(parts.query, keep_blank_values=True)
              if _secret_param(k) and v]
    return tuple(sorted({x for s in found for x in (s, quote(s, safe=""), unquote(s)) if x},
                        key=len, reverse=True))


def scrub(text: str, secrets) -> str:
    """`text` with every secret replaced by ***: driver messages may echo a password."""
    for secret in secrets:
        text = text.replace(secret, "***")
    return text
