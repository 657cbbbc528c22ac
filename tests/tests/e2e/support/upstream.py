"""The egress tests' upstream, run inside the network namespace the test creates.

argv: ROOT_DIR CERT KEY RECORD_FILE. Serves, on every address of the namespace:
- HTTP on 80: files under ROOT_DIR (a PEP 503 index lives there), /echo, which answers
  with the request's headers, and /echo-header, which repeats its Authorization in a
  response header;
- HTTPS on 443 (CERT, KEY): the same;
- raw TCP on 9000: answers `raw-ok` and closes;
- UDP on 53 and 9999: appends every datagram it receives to RECORD_FILE, one line each.
Prints `ready` once every socket listens.
"""
import http.server
import socket
import ssl
import sys
import threading

root, cert, key, record = sys.argv[1:5]


class Handler(http.server.SimpleHTTPRequestHandler):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, directory=root, **kwargs)

    def do_GET(self):
        if self.path.startswith("/echo-header"):
            # Repeats the request's Authorization in a response header, as some error pages do.
            self.send_response(401)
            self.send_header("X-Echo-Authorization", self.headers.get("Authorization", ""))
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        if self.path.startswith("/echo"):
            body = "".join(f"{k}: {v}\n" for k, v in self.headers.items())
            body += f"path: {self.path}\n"
            data = body.encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
            return
        super().do_GET()

    def log_message(self, *args):
        pass


def http_server(port, tls):
    server = http.server.ThreadingHTTPServer(("0.0.0.0", port), Handler)
    if tls:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(cert, key)
        server.socket = ctx.wrap_socket(server.socket, server_side=True)
    return server


def raw_server():
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("0.0.0.0", 9000))
    s.listen(16)

    def serve():
        while True:
            conn, _ = s.accept()
            conn.sendall(b"raw-ok\n")
            conn.close()

    return serve


def udp_sink(port):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("0.0.0.0", port))

    def serve():
        while True:
            data, _ = s.recvfrom(65536)
            with open(record, "a") as f:
                f.write(f"{port} {data!r}\n")

    return serve


servers = [http_server(80, False), http_server(443, True)]
loops = [srv.serve_forever for srv in servers] + [raw_server(), udp_sink(53), udp_sink(9999)]
for loop in loops:
    threading.Thread(target=loop, daemon=True).start()
print("ready", flush=True)
threading.Event().wait()
