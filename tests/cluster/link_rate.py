"""The rate of a link between two cluster nodes, measured with one TCP stream.

  link_rate.py recv PORT          (on the receiving node) prints "BYTES SECONDS"
  link_rate.py send HOST PORT MIB (on the sending node)

The receiver times from the first byte to the last, so connection set-up and
the sender's start do not count. Both sides give up after 120 s.
"""
import socket
import sys
import time


def recv(port):
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("0.0.0.0", port))
    srv.listen(1)
    srv.settimeout(120)
    conn, _ = srv.accept()
    conn.settimeout(120)
    total, start = 0, None
    while True:
        chunk = conn.recv(1 << 20)
        if not chunk:
            break
        if start is None:
            start = time.monotonic()
        total += len(chunk)
    print(total, time.monotonic() - start)


def send(host, port, mib):
    deadline = time.monotonic() + 120
    while True:
        try:
            conn = socket.create_connection((host, port), timeout=5)
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)
    block = b"\0" * (1 << 20)
    for _ in range(mib):
        conn.sendall(block)
    conn.close()


if __name__ == "__main__":
    if sys.argv[1] == "recv":
        recv(int(sys.argv[2]))
    else:
        send(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
