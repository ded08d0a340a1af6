"""Downloading a corpus archive: a server that sends too slowly is given up in one line, nothing half-written kept; a
download shows its progress."""

import contextlib
import http.server
import threading
import time

import pytest

from deepnmt_plugin.data import archives
from deepnmt_plugin.data.archives import Archive, ensure_archives
from deepnmt_plugin.data.pipeline import DataPrepError


@contextlib.contextmanager
def server(body: bytes, seconds_per_byte: float):
    """An HTTP server on 127.0.0.1 sending ``body`` one byte every ``seconds_per_byte`` (0: at once)."""
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            try:
                if not seconds_per_byte:
                    self.wfile.write(body)
                for byte in body if seconds_per_byte else b"":
                    self.wfile.write(bytes([byte]))
                    self.wfile.flush()
                    time.sleep(seconds_per_byte)
            except (BrokenPipeError, ConnectionResetError):  # the client gave up
                pass

        def log_message(self, *args):
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}/corpus.tgz"
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_a_trickling_server_is_given_up_in_one_line_and_nothing_is_kept(tmp_path, monkeypatch):
    """Each byte comes well within the per-read timeout, so only the rate shows that it would take hours."""
    monkeypatch.setattr(archives, "RATE_WINDOW", 0.5)
    monkeypatch.setattr(archives, "MIN_BYTES_PER_SECOND", 1000)
    with server(b"x" * 100_000, seconds_per_byte=0.02) as url:
        started = time.monotonic()
        with pytest.raises(DataPrepError) as refused:
            ensure_archives([Archive("corpus.tgz", url)], tmp_path, download=True)
    assert time.monotonic() - started < 30
    message = str(refused.value)
    assert message.startswith(f"downloading {url} failed (") and "bytes/s over the last" in message
    assert "below 1000 bytes/s" in message.splitlines()[0]
    assert list(tmp_path.iterdir()) == []  # no corpus.tgz, no corpus.tgz.partial


def test_a_download_shows_its_progress_and_keeps_the_whole_file(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(archives, "PROGRESS_SECONDS", 0)
    body = bytes(range(256)) * 8192  # 2 MiB
    with server(body, seconds_per_byte=0) as url:
        ensure_archives([Archive("corpus.tgz", url)], tmp_path, download=True)
    assert (tmp_path / "corpus.tgz").read_bytes() == body
    assert "  corpus.tgz: 2.0 of 2.0 MiB" in capsys.readouterr().out.splitlines()
