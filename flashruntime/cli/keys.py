"""``flashruntime keys generate``: a submitter's ed25519 key pair for signed work.

The private key (``NAME.key``, mode 0600) signs jobs (``flashruntime submit-spec --sign-key``);
the public key (``NAME.pub``) goes to the workers that should run them
(``flashruntime worker --trusted-submitter-keys``). Needs the ``signing`` extra.
Exit codes: 0 written; 2 the name is not usable, a file exists already, or cryptography is missing.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

EXIT_OK, EXIT_INVALID = 0, 2


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "keys", help="signing keys for signed work (generate)",
        description="Signing keys: a submitter signs command jobs, workers that trust the key run only those.",
    )
    actions = parser.add_subparsers(dest="keys_action", metavar="ACTION", required=True)
    generate = actions.add_parser(
        "generate", help="write a new key pair: NAME.key (private, 0600) and NAME.pub",
        description="Write a new ed25519 key pair into --out: NAME.key (the private key, mode 0600; keep it to "
                    "yourself) and NAME.pub (give it to the workers that should run your jobs).",
    )
    generate.add_argument("--out", required=True, metavar="DIR", help="directory to write the two files into")
    generate.add_argument("--name", required=True,
                          help="the signer's name, which workers see in the signature (e.g. alice)")
    generate.add_argument("--json", action="store_true", help="print the paths and key id as one JSON object")
    generate.set_defaults(handler=handle_generate)


def handle_generate(args: argparse.Namespace) -> int:
    from flashruntime.errors import SigningError
    from flashruntime.signing import generate_key_pair, load_signing_key

    try:
        key_path, pub_path = generate_key_pair(args.out, args.name)
        key_id = load_signing_key(key_path).public.key_id
    except (SigningError, OSError) as exc:
        print(f"flashruntime keys generate: {exc}", file=sys.stderr)
        return EXIT_INVALID
    if args.json:
        print(json.dumps({"private_key": str(key_path), "public_key": str(pub_path), "key_id": key_id}))
    else:
        print(f"private key: {key_path} (mode 0600; sign with: flashruntime submit-spec SPEC --sign-key {key_path})")
        print(f"public key:  {pub_path} (trust with: flashruntime worker --trusted-submitter-keys {pub_path})")
        print(f"key id:      {key_id}")
    return EXIT_OK
