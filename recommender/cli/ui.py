"""The web UI: `ticketrec serve` and `ticketrec demo` (the CLI alone imports web, lazily)."""
from __future__ import annotations

import click

from ..errors import TicketrecError
from .common import main, one_line, open_store, settings


@main.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="address to listen on (0.0.0.0: every interface)")
@click.option("--port", default=5000, show_default=True, type=click.IntRange(1, 65535), help="TCP port")
def serve(host: str, port: int) -> None:
    """Serve the support engineer's web UI and JSON API (embedded; in production use gunicorn with
    --config python:web.gunicorn_conf 'web:create_app()', which warms each worker before it takes requests)."""
    _serve(host, port)


def _serve(host: str, port: int) -> None:
    from werkzeug.serving import make_server

    from web import create_app  # the composition root alone imports web, lazily

    app = create_app()
    problem = app.extensions["ticketrec"].warm_up()  # load and warm the model now, not on the first query
    if problem:
        click.secho(f"warning: no recommendations yet: {problem}", fg="yellow", err=True)
    try:
        server = make_server(host, port, app, threaded=True)
    except OSError as exc:
        raise TicketrecError(f"cannot listen on {host}:{port} ({exc.strerror}); choose another --port") from exc
    click.echo(f"ticketrec UI on http://{host}:{server.server_port}/  (Ctrl-C stops it)")
    try:
        server.serve_forever()
    finally:
        server.server_close()


@main.command()
@click.option("--tickets", "n_tickets", type=click.IntRange(50, 100_000), default=2000, show_default=True,
              help="synthetic tickets in the demo knowledge base")
@click.option("--queries", "n_queries", type=click.IntRange(10, 10_000), default=200, show_default=True,
              help="labelled synthetic queries the demo model is trained on")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--pretrained/--no-pretrained", default=False, show_default=True,
              help="train with the pretrained sentence-encoder channel S (slower; needs the [pretrained] extra)")
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=5000, show_default=True, type=click.IntRange(1, 65535))
@click.option("--serve/--no-serve", "then_serve", default=True, show_default=True, help="serve the UI at the end")
def demo(n_tickets: int, n_queries: int, seed: int, pretrained: bool, host: str, port: int, then_serve: bool) -> None:
    """Set up a synthetic knowledge base, train a model, build the index and serve the UI (each step once)."""
    from ..serving.engine import Recommender
    from ..serving.reindex import reindex as reindex_here
    from ..model.bundle import TicketModel
    from ..data.records import Query
    from ..model.siamese import SiameseConfig
    from ..data.synthetic import generate, write_jsonl
    from ..model.training import train_model

    cfg = settings()
    click.secho(f"ticketrec demo in {cfg.home}", bold=True)
    store = open_store()
    try:
        if store.stats()["tickets"] == 0:
            click.echo(f"1/3 knowledge base: generating {n_tickets:,} synthetic tickets and {n_queries} labelled "
                       "queries")
            data = generate(n_tickets=n_tickets, n_queries=n_queries, seed=seed)
            write_jsonl(data, cfg.home / "demo-knowledge-base.jsonl")
            store.import_dataset(data)
        else:
            click.echo(f"1/3 knowledge base: {store.stats()['tickets']:,} tickets already in {cfg.db}")
        if (cfg.model / "config.json").exists():
            click.echo(f"2/3 model: using {cfg.model}")
            model = TicketModel.load(cfg.model)
        else:
            config = SiameseConfig.preset("default_s" if pretrained else "default")
            click.echo("2/3 model: training the Replicated Siamese LSTM on the knowledge base's labelled pairs")
            model = train_model(store.dataset(), None, config, cfg.model, seed=seed, progress=True)
        click.echo("3/3 index: encoding new or changed tickets")
        version = reindex_here(cfg, store, model, progress=True)["version"]
        click.echo(f"    index version {version}")
        sample = Query("GT trips on high exhaust temperature spread",
                       "Unit ## tripped during loading. Exhaust thermocouples show a large spread and the "
                       "combustion monitor alarmed. XXXX suspects a burner problem. What should we check?")
        results = Recommender(cfg, store=store, model=model).recommend(sample, k=3)
        click.secho(f"sample query: {sample.subject}", bold=True)
        for r in results:
            solution = one_line(r.ticket.solution, 100)
            click.echo(f"  {r.rank}. [{r.score:.1f}/5] {one_line(r.ticket.subject)} -> {solution}")
    finally:
        store.close()
    if then_serve:
        _serve(host, port)
