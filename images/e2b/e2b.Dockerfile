# An E2B template with the static tether-agent on its PATH. Build it from this directory
# after copying the static agent here (see README.md):
#
#   e2b template create tether-sandbox -d e2b.Dockerfile --ready-cmd "tether-agent version"
#
# E2B builds Debian-based images (and, recently, a few other distributions; never scratch or
# distroless) and boots them with its own init: ENTRYPOINT and CMD are not run, and there is
# deliberately no start command (see README.md). E2B provides `sh` and its default user.
FROM --platform=linux/amd64 debian:bookworm-slim
COPY tether-agent /usr/local/bin/tether-agent
RUN chmod 0755 /usr/local/bin/tether-agent && /usr/local/bin/tether-agent version
