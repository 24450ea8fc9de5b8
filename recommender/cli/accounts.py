"""Accounts and API tokens of the web app: `ticketrec user` and `ticketrec token`."""
from __future__ import annotations

import sys

import click

from .common import echo_json, main, open_store, warn, when


def _read_password(from_stdin: bool) -> str:
    """The new password: the first line of standard input with --password-stdin, else asked twice on the terminal;
    with neither (CI, a pipe) an error that says how to pass it, never a prompt that waits forever."""
    from ..errors import InputError

    if from_stdin:
        password = sys.stdin.readline().rstrip("\r\n")
        if not password:
            raise InputError("--password-stdin read no password: send it as the first line of standard input")
        return password
    if not sys.stdin.isatty():
        raise InputError("no terminal to ask for the password on; pass it on standard input with --password-stdin, "
                         "e.g. printf '%s\\n' \"$PASSWORD\" | ticketrec user add NAME --password-stdin")
    return click.prompt("Password", hide_input=True, confirmation_prompt="Repeat the password")


@main.group()
def user() -> None:
    """Engineers' accounts of the web app: they sign in to give feedback, which records their name. Once one exists,
    feedback needs a signed-in user or an API token, and reading does too unless TICKETREC_AUTH_READ=open."""


@user.command("add")
@click.argument("name")
@click.option("--password-stdin", is_flag=True, help="Read the password from the first line of standard input.")
def user_add(name: str, password_stdin: bool) -> None:
    """Create the account NAME (the password is asked twice, or read with --password-stdin)."""
    from ..data.store import check_user_name
    from ..errors import InputError

    check_user_name(name)
    with open_store() as store:
        if store.user_stamp(name) is not None:
            raise InputError(f"there is already a user {name!r}; `ticketrec user passwd {name}` changes the password")
        first = not store.has_users()
        store.add_user(name, _read_password(password_stdin))
    click.echo(f"user {name} added; it signs in at /login of the web app")
    if first:
        warn("this is the first account: the web app now asks for a signed-in user or an API token to give "
              "feedback, and to read unless TICKETREC_AUTH_READ=open")


@user.command("passwd")
@click.argument("name")
@click.option("--password-stdin", is_flag=True, help="Read the password from the first line of standard input.")
def user_passwd(name: str, password_stdin: bool) -> None:
    """Change NAME's password (its open sessions end; its API tokens stay valid)."""
    from ..errors import InputError

    with open_store() as store:
        if store.user_stamp(name) is None:
            raise InputError(f"there is no user {name!r}; `ticketrec user list` shows them")
        store.set_password(name, _read_password(password_stdin))
    click.echo(f"password of {name} changed")


@user.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print the accounts as JSON.")
def user_list(as_json: bool) -> None:
    """Every account with its creation time and number of live API tokens."""
    with open_store() as store:
        users = store.users()
    if as_json:
        echo_json([{"name": u.name, "created_at": u.created_at, "tokens": u.tokens} for u in users])
        return
    if not users:
        click.echo("no users: the web app is open to anyone who reaches it (`ticketrec user add NAME` creates one)")
    for u in users:
        click.echo(f"{u.name:<24} created {when(u.created_at)}  {u.tokens} API token(s)")


@user.command("remove")
@click.argument("name")
def user_remove(name: str) -> None:
    """Delete the account NAME and its API tokens (the feedback it gave keeps its name)."""
    with open_store() as store:
        tokens = store.remove_user(name)
        last = not store.has_users()
    click.echo(f"user {name} removed" + (f" with its {tokens} API token(s)" if tokens else ""))
    if last:
        warn("no account is left: the web app is open to anyone who reaches it again")


@main.group()
def token() -> None:
    """API tokens: programs send one as `Authorization: Bearer <token>` to the JSON API and act as its user."""


@token.command("create")
@click.argument("name")
@click.option("--read-only", is_flag=True, help="A token that may read but not give feedback (403).")
@click.option("--tickets", is_flag=True,
              help="A token that may also add, replace and remove tickets (PUT and DELETE /api/v1/tickets/ID): for a "
                   "help desk's integration that keeps the knowledge base current.")
def token_create(name: str, read_only: bool, tickets: bool) -> None:
    """Create an API token for the user NAME and print it once (only its SHA-256 is stored)."""
    if read_only and tickets:
        raise click.UsageError("--read-only and --tickets contradict each other; give one")
    with open_store() as store:
        record, secret = store.create_token(name, "read" if read_only else "tickets" if tickets else "write")
    click.echo(secret)
    click.echo(f"API token {record.id} of {name} ({record.scope}); it is shown only now: store it safely, "
               f"`ticketrec token revoke {record.id}` disables it", err=True)


@token.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print the tokens as JSON.")
def token_list(as_json: bool) -> None:
    """Every API token (never the token itself): id, user, scope, created, revoked."""
    with open_store() as store:
        tokens = store.tokens()
    if as_json:
        echo_json([{"id": t.id, "user": t.user_name, "scope": t.scope, "created_at": t.created_at,
                    "revoked_at": t.revoked_at} for t in tokens])
        return
    if not tokens:
        click.echo("no API tokens (`ticketrec token create USER` makes one)")
    for t in tokens:
        state = f"revoked {when(t.revoked_at)}" if t.revoked_at is not None else "live"
        click.echo(f"{t.id:>4}  {t.user_name:<24} {t.scope:<7}  created {when(t.created_at)}  {state}")


@token.command("revoke")
@click.argument("token_id", metavar="ID", type=int)
def token_revoke(token_id: int) -> None:
    """Revoke the API token ID (`ticketrec token list` shows the ids); it is refused from then on."""
    with open_store() as store:
        record = store.revoke_token(token_id)
    click.echo(f"API token {record.id} of {record.user_name} revoked")
