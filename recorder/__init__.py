"""The write side: spools, blobs, the proxy addon, the shim, and run orchestration.

Depends on ``schemas`` only (plus mitmproxy inside the proxy addon).
"""
