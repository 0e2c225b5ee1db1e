#!/usr/bin/env python3
"""A stand-in for the EC2 instance metadata service (IMDSv2) that hands out fixed
credentials for one role.

    imds_stub.py ACCESS_KEY SECRET_KEY

Listens on a free port of 127.0.0.1 and prints it as its first line. A token comes from
PUT /latest/api/token (which needs the TTL header); the credential paths need that token,
as the real service does, and answer 401 without it.
"""
import http.server
import json
import sys

access, secret = sys.argv[1], sys.argv[2]
TOKEN = "stub-session-token-1"
ROLE = "neffcache-test-role"


class Handler(http.server.BaseHTTPRequestHandler):
    def answer(self, status, body):
        data = body.encode()
        self.send_response(status)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_PUT(self):
        if self.path != "/latest/api/token" or not self.headers.get("X-aws-ec2-metadata-token-ttl-seconds"):
            return self.answer(400, "")
        self.answer(200, TOKEN)

    def do_GET(self):
        if self.headers.get("X-aws-ec2-metadata-token") != TOKEN:
            return self.answer(401, "")
        base = "/latest/meta-data/iam/security-credentials/"
        if self.path == base:
            return self.answer(200, ROLE + "\n")
        if self.path == base + ROLE:
            return self.answer(200, json.dumps({
                "Code": "Success", "Type": "AWS-HMAC", "AccessKeyId": access, "SecretAccessKey": secret,
                "Token": "", "Expiration": "2099-01-01T00:00:00Z"}))
        self.answer(404, "")

    def log_message(self, *args):
        pass


server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
print(server.server_address[1], flush=True)
server.serve_forever()
