"""Checks the fake Modal's blob storage against the official SDK's own blob code
(`modal/_utils/blob_utils.py`, what the SDK uses for every file of 4 MiB or more and for large
inputs and outputs): an upload through BlobCreate and the URLs it answers (one PUT, or a
multipart upload when the content is over the fake's part size), read back through BlobGet,
and the bucket's refusals in S3's words.

Run by tests/tests/e2e/providers_fidelity.rs with MODAL_TOKEN_ID, MODAL_TOKEN_SECRET and
MODAL_SERVER_URL pointing at `tether-fake modal --blob-part-bytes N`, and FIDELITY_PART_BYTES
= N. Exits non-zero, with the reason, on any mismatch. The blob functions are async, so this
is its own process with its own event loop.
"""

import asyncio
import base64
import hashlib
import os
import urllib.error
import urllib.request

from modal._utils.blob_utils import blob_download, blob_upload
from modal.client import _Client
from modal_proto import api_pb2

PART = int(os.environ["FIDELITY_PART_BYTES"])


def put(url, body, headers):
    request = urllib.request.Request(url, data=body, method="PUT", headers=headers)
    try:
        with urllib.request.urlopen(request) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


async def main():
    client = await _Client.from_env()
    stub = client.stub
    # One PUT (at most a part's size), then a multipart upload (two and a half parts).
    for size in (PART - 1000, PART * 5 // 2):
        payload = os.urandom(size)
        blob_id = await blob_upload(payload, stub)
        back = await blob_download(blob_id, stub)
        assert back == payload, (size, len(back))
        print("blob of", size, "bytes stored and read back as", blob_id)

    # The bucket refuses as S3 does: a Content-MD5 that is not the body's, and a URL whose
    # signature (token) is not the one issued.
    body = os.urandom(1000)
    md5 = base64.b64encode(hashlib.md5(body).digest()).decode()
    sha = base64.b64encode(hashlib.sha256(body).digest()).decode()
    created = await stub.BlobCreate(
        api_pb2.BlobCreateRequest(content_md5=md5, content_sha256_base64=sha, content_length=len(body))
    )
    url = created.upload_urls.items[0]
    wrong = base64.b64encode(hashlib.md5(b"other").digest()).decode()
    status, text = put(url, body, {"Content-MD5": wrong})
    assert status == 400 and "The Content-MD5 you specified did not match what we received." in text, (status, text)
    status, text = put(url.replace("token=", "token=0"), body, {})
    assert status == 403 and "AccessDenied" in text, (status, text)
    status, text = put(url, body, {"Content-MD5": md5})
    assert status == 200, (status, text)
    print("the bucket checks digests and signatures")


asyncio.run(main())
