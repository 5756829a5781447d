"""A real S3 server on loopback for the tests: moto's server mode, started as a subprocess.

moto checks ``If-None-Match: *`` and then stores the object without holding a lock, so two
truly concurrent conditional PUTs could both pass its check. Real S3 decides them atomically.
We serialise request handling inside the server process (connections stay concurrent) so the
server has S3's semantics and the tests exercise only *our* side of the race.

Run: ``python tests/s3_server.py PORT``; prints ``ready`` once it accepts connections.
"""

from __future__ import annotations

import sys
import threading


def main() -> None:
    port = int(sys.argv[1])
    from moto.moto_server.werkzeug_app import (
        DomainDispatcherApplication,
        MotoRequestHandler,
        create_backend_app,
    )
    from werkzeug.serving import make_server

    app = DomainDispatcherApplication(create_backend_app)
    lock = threading.Lock()

    def serialized(environ, start_response):
        with lock:
            # Materialise the body inside the lock: the response iterable may be lazy.
            return list(app(environ, start_response))

    server = make_server("127.0.0.1", port, serialized, threaded=True, request_handler=MotoRequestHandler)
    print("ready", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
