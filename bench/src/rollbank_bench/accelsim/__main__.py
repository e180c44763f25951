"""``python -m rollbank_bench.accelsim --profile PROFILE --port N``: one benchmark engine process."""

from __future__ import annotations

import argparse

from aiohttp import web

from rollbank_bench.accelsim.driver import EngineDriver
from rollbank_bench.accelsim.profile import load_profile, profile_names, with_overrides
from rollbank_bench.accelsim.server import make_app


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m rollbank_bench.accelsim",
                                description="accelsim: accelerator-regime vLLM API emulator (benchmarks only)")
    p.add_argument("--profile", default="h100-llama3.1-8b",
                   help=f"latency profile name ({', '.join(profile_names())}) or TOML path")
    p.add_argument("--host", default="127.0.0.1", help="bind address")
    p.add_argument("--port", type=int, required=True, help="port")
    p.add_argument("--seed", type=int, default=0, help="token generation seed")
    p.add_argument("--served-model-name", default="accelsim", help="model name requests may name")
    p.add_argument("--vocab-size", type=int, default=None,
                   help="override the profile's vocabulary (match the tokenizer rollbank decodes with)")
    p.add_argument("--max-model-len", type=int, default=None, help="override the profile's max_model_len")
    p.add_argument("--token-scale", type=float, default=None,
                   help="instrument: each engine token stands for this many modelled tokens")
    p.add_argument("--time-scale", type=float, default=None,
                   help="instrument: time compression (steps last 1/N of their modelled time)")
    args = p.parse_args(argv)
    profile = with_overrides(load_profile(args.profile), vocab_size=args.vocab_size,
                             max_model_len=args.max_model_len, token_scale=args.token_scale,
                             time_scale=args.time_scale)

    async def app() -> web.Application:  # the driver needs the running loop
        return make_app(EngineDriver(profile, seed=args.seed, served_model=args.served_model_name))

    print(f"accelsim benchmark engine: profile {profile.name} on {args.host}:{args.port}", flush=True)
    web.run_app(app(), host=args.host, port=args.port, print=None, access_log=None,
                handler_cancellation=True, shutdown_timeout=1.0)


if __name__ == "__main__":
    main()
