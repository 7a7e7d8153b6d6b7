"""python -m rlinf_like.tinker serve --model PATH [--port 8000] [--out runs/tinker] [--backend local|ray]

Then, in any program: `tinker.ServiceClient(base_url="http://127.0.0.1:8000", api_key="tml-local")` (any key that
starts with `tml-`), and `create_lora_training_client(base_model=PATH or its hub id, rank=...)`."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m rlinf_like.tinker")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="serve a model to tinker clients")
    serve.add_argument("--model", required=True, help="a local HF checkpoint folder")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--out", default="runs/tinker", help="where saved weights (tinker:// paths) are kept")
    serve.add_argument("--backend", choices=("local", "ray"), default="local",
                       help="local: the actor in this process; ray: on a Ray worker group")
    serve.add_argument("--precision", choices=("fp32", "bf16", "auto"), default="fp32")
    args = parser.parse_args(argv)
    if not (Path(args.model) / "config.json").is_file():
        parser.error(f"--model {args.model!r} is not a model folder (no config.json)")

    from rlinf_like.runtime import Cluster, ClusterConfig
    from rlinf_like.tinker.server import TinkerServer
    from rlinf_like.tinker.service import TinkerService, served_names
    from rlinf_like.utils.logging import setup_logging

    setup_logging()
    with Cluster(ClusterConfig(backend=args.backend, num_cpus=1 if args.backend == "local" else None)) as cluster:
        service = TinkerService(args.model, served_names(args.model), Path(args.out), cluster, args.precision)
        server = TinkerServer(service, args.host, args.port)
        print(f"Tinker-compatible server for {service.names} on http://{args.host}:{args.port} "
              f"(TINKER_BASE_URL; any API key starting with 'tml-')", flush=True)
        try:
            server.run()
        finally:
            server.close()


if __name__ == "__main__":
    sys.exit(main())
