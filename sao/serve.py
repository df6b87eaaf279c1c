"""`sao serve`: an engine plus the token-exact proxy as a standalone OpenAI-compatible server.

Any OpenAI-compatible scaffold can use it (base URL ``http://127.0.0.1:8000/v1``; send the episode in
an ``X-Episode-Id`` header). ``POST /episodes/{id}/close`` writes that episode's trace to the run's
trace store (``<run.dir>/traces``) and answers its ``traj_id`` and shard path; episodes still open at
shutdown are written then. Loopback only, unless a bearer token (``proxy.token``, else
``$SAO_PROXY_TOKEN``) guards it: then every request must send ``Authorization: Bearer <token>``.
Bodies over ``proxy.max_request_bytes`` are answered 413.
"""
from __future__ import annotations

import signal


def _serve(args) -> int:
    import uvicorn  # lazy: heavy server dependency

    # lazy: keeps `sao --help` fast
    from sao_harness.harness.proxy import ProxyServer, check_loopback
    from sao_harness.harness.store import TraceStore

    cfg = args.cfg
    if args.model:
        cfg.model.path = args.model
    host = args.host or cfg.proxy.host
    port = cfg.proxy.port if args.port is None else args.port
    token = cfg.proxy.resolved_token()
    check_loopback(host, token)

    # lazy: keeps `sao --help` fast
    from sao_harness.harness.engines import make_engine
    from sao_harness.harness.tiny_model import resolve_model_path

    engine = make_engine(cfg)
    tokenizer = getattr(engine, "tokenizer", None)
    if tokenizer is None:
        from transformers import AutoTokenizer  # lazy: transformers is heavy

        tokenizer = AutoTokenizer.from_pretrained(resolve_model_path(cfg.model))
    store = TraceStore(cfg.run.dir)
    proxy = ProxyServer(engine, tokenizer, cfg, store=store)
    print(f"sao serve: {cfg.model.path} on the {cfg.engine.kind} engine at http://{host}:{port}/v1 "
          f"(traces -> {store.dir})", flush=True)
    def _term(signum, frame):
        raise KeyboardInterrupt  # uvicorn re-raises the signal after its graceful shutdown: end here, cleanly

    signal.signal(signal.SIGTERM, _term)
    try:
        uvicorn.run(proxy.app, host=host, port=port, log_level="warning", access_log=False, lifespan="off")
    except KeyboardInterrupt:
        pass
    finally:
        written = proxy.close_all()
        if written:
            print(f"sao serve: wrote {len(written)} open episode trace(s) to {store.dir}", flush=True)
        engine.close()
    return 0


def register(sub, add_config_args):
    p = sub.add_parser("serve", help="engine + token-exact OpenAI-compatible proxy (loopback unless a token is set)")
    add_config_args(p)
    p.add_argument("--model", metavar="PATH_OR_ID", default=None, help="model path or id (default: model.path)")
    p.add_argument("--host", default=None, help="address to bind (default: proxy.host, 127.0.0.1); a non-loopback one "
                   "needs proxy.token or $SAO_PROXY_TOKEN")
    p.add_argument("--port", type=int, default=None, help="port (default: proxy.port, 8000)")
    p.set_defaults(func=_serve)
