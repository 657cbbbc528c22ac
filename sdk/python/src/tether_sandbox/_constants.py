"""Tunables and protocol limits, with their units, in one place."""

from __future__ import annotations

# --- the protocol (proto/PROTOCOL.md section 14) --------------------------------------------
PROTOCOL_VERSION = 1
FRAME_VERSION = 1
HEADER_LEN = 6  # bytes
MAX_PAYLOAD = 1 << 20  # 1 MiB: the largest payload of any frame
DATA_CHUNK = 1 << 16  # 64 KiB: the largest data payload we send
INITIAL_WINDOW = 4 << 20  # 4 MiB: default credit per stream direction
MAX_WINDOW = 64 << 20  # 64 MiB: the most credit a receiver may grant
BULK_WINDOW = 16 << 20  # 16 MiB: credit we grant on streams that move a lot of bytes
PING_INTERVAL_S = 20.0  # seconds between our pings
PING_TIMEOUT_S = 60.0  # seconds without a pong before the connection counts as dead

# --- connecting ------------------------------------------------------------------------------
DEFAULT_RELAY = "http://127.0.0.1:7420"
ADMIN_TOKEN_FILE = "admin.token"
CLIENT_NAME = "tether-sandbox-python/0.1.0"
CONNECT_TIMEOUT_S = 30.0  # seconds for a TCP connect plus the WebSocket upgrade
HANDSHAKE_TIMEOUT_S = 30.0  # seconds to wait for `welcome`
HTTP_TIMEOUT_S = 120.0  # seconds for one REST call (a create may pull an image)

# --- preview URLs (_preview.py) --------------------------------------------------------------
PREVIEW_TOKEN_PARAM = "tether_preview_token"  # the query parameter the relay takes the token in
PREVIEW_RESOLVE_TIMEOUT_S = 2.0  # seconds to wait for the resolver before taking the path form

# --- retries (REST 429/5xx and WebSocket 502/503) --------------------------------------------
RETRY_ATTEMPTS = 6  # tries in all, the first included
RETRY_BASE_S = 0.2  # seconds before the first retry; doubled each time
RETRY_MAX_S = 5.0  # seconds: the longest wait between tries
RETRY_AFTER_MAX_S = 30.0  # seconds: the most of a Retry-After header we honour

# --- what we accept from the sandbox (never trusted) -----------------------------------------
DEFAULT_MAX_READ = 1 << 30  # 1 GiB: the default cap on one file read into memory
DEFAULT_MAX_DOWNLOAD = 4 << 30  # 4 GiB: default cap on a directory download (unpacked)
MAX_TAR_ENTRIES = 1_000_000  # entries in one downloaded archive
MAX_QUEUED_CONTROLS = 100_000  # unread control messages (watch events) one stream may queue

# --- landing files on this machine (_landing.py) ----------------------------------------------
MAX_NAME_BYTES = 255  # bytes in one component of a name from the sandbox (NAME_MAX)
MAX_PATH_BYTES = 4095  # bytes in a whole name or link target from the sandbox (PATH_MAX - 1)
MAX_LINK_HOPS = 40  # links followed resolving one link target, as the kernel allows
LANDING_PREFIX = ".tether-"  # temporary names: this prefix and LANDING_RANDOM_HEX hex digits
LANDING_RANDOM_HEX = 12  # 48 random bits per temporary name
LANDING_ATTEMPTS = 16  # fresh names tried before giving up (each taken: someone else's)
LANDING_COPY = 1 << 20  # 1 MiB: bytes copied per write when landing a file

# --- the code session ----------------------------------------------------------------------
CODE_DRIVER_DIR = "/tmp/.tether"  # where the driver script is uploaded in the sandbox
CODE_REPLY_MAX = 256 << 20  # 256 MiB: the largest reply line the driver may send
