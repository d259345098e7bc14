"""The store: verified blobs and JSON entries on disk, archives, remote tiers, gc."""
