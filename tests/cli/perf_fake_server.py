#!/usr/bin/env python3
"""A stand-in generation server for tests/cli/perf.sh: OpenAI /v1/completions and Triton's
/v2/models/M/generate[_stream], streamed (Server-Sent Events, chunked) or whole. Each request
makes max_tokens tokens, the first after --ttft-ms and then one every --token-ms, so kiln perf's
measurements can be checked against known lower bounds. Prints its port on the first line.

usage: perf_fake_server.py MODEL [--ttft-ms 20] [--token-ms 5] [--api-key KEY]
"""
import argparse
import json
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

args = None


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as kiln perf's clients expect
    # Each event leaves at once (Nagle's algorithm would hold small writes for the client's
    # delayed ACK, up to 40 ms: a server's problem that would show up as TTFT).
    disable_nagle_algorithm = True

    def log_message(self, *_):
        pass

    def send_json(self, status, obj):
        body = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def chunk(self, text):
        data = text.encode()
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if args.api_key and self.headers.get("Authorization") != "Bearer " + args.api_key:
            return self.send_json(401, {"error": {"message": "bad API key"}})
        if self.path == "/v1/completions":
            model, stream = body["model"], body.get("stream", False)
            n = body["max_tokens"]
        elif self.path.startswith("/v2/models/"):
            parts = self.path.split("/")
            model, stream = parts[3], parts[4] == "generate_stream"
            n = body["parameters"]["max_tokens"]
        else:
            return self.send_json(404, {"error": "no route " + self.path})
        if model != args.model:
            return self.send_json(404, {"error": {"message": "no model named " + model}})
        openai = self.path == "/v1/completions"
        if not stream:
            time.sleep((args.ttft_ms + (n - 1) * args.token_ms) / 1000)
            text = " tok" * n
            if openai:
                return self.send_json(200, {"choices": [{"text": text, "index": 0}],
                                            "usage": {"completion_tokens": n}})
            return self.send_json(200, {"model_name": model, "text_output": text,
                                        "token_ids": list(range(n))})
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        try:
            for i in range(n):
                time.sleep((args.ttft_ms if i == 0 else args.token_ms) / 1000)
                event = ({"choices": [{"text": " tok", "index": 0}]} if openai else
                         {"model_name": model, "text_output": " tok", "token_ids": [i]})
                self.chunk("data: " + json.dumps(event) + "\n\n")
            if openai:
                if body.get("stream_options", {}).get("include_usage"):
                    self.chunk("data: " + json.dumps({"choices": [], "usage": {
                        "completion_tokens": n}}) + "\n\n")
                self.chunk("data: [DONE]\n\n")
            self.wfile.write(b"0\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True  # the client abandoned the request


def main():
    global args
    p = argparse.ArgumentParser()
    p.add_argument("model")
    p.add_argument("--ttft-ms", type=float, default=20)
    p.add_argument("--token-ms", type=float, default=5)
    p.add_argument("--api-key", default="")
    args = p.parse_args()
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    print(server.server_address[1], flush=True)
    server.serve_forever()


if __name__ == "__main__":
    sys.exit(main())
