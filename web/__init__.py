"""The support engineer's web app: Flask app factory (`create_app`), pages, JSON API. gunicorn: `web:create_app()`."""
from __future__ import annotations

import logging
from typing import Any, Mapping

from flask import Flask, Request, render_template, request
from flask.json.provider import DefaultJSONProvider
from flask_wtf.csrf import CSRFError, CSRFProtect
from werkzeug.exceptions import BadRequest, HTTPException, InternalServerError

from recommender.config import Settings
from recommender.data.records import parse_json
from recommender.errors import InputError

from . import auth
from .services import TicketrecServices

csrf = CSRFProtect()
log = logging.getLogger(__name__)

#: Bytes a request body may have besides the description itself (subject, JSON, form fields, CSRF token).
_BODY_OVERHEAD = 64 * 1024


class StrictJSONProvider(DefaultJSONProvider):
    """Flask's JSON, read strictly (`records.parse_json`): bad JSON, NaN, numbers of hundreds of digits, deep nesting
    and lone surrogates are a ValueError with a one-line reason, which the request turns into a 400."""

    def loads(self, s: str | bytes, **kwargs: Any) -> Any:
        try:
            return parse_json(s)
        except InputError as exc:
            raise ValueError(str(exc)) from None


class StrictRequest(Request):
    """A request whose unreadable JSON body is a 400 saying why (Flask's default hides the reason)."""

    def on_json_loading_failed(self, e: ValueError | None) -> Any:
        if e is None:  # not JSON at all (Content-Type): Flask's own 415
            return super().on_json_loading_failed(e)
        raise BadRequest(f"the body is not valid JSON: {e}; send one UTF-8 JSON object")


def create_app(test_config: Mapping[str, Any] | None = None) -> Flask:
    """Build the app from the TICKETREC_* settings; `test_config` overrides any Flask config key.

    Extra keys it understands: TICKETREC_SETTINGS (a `Settings`), TICKETREC_ENGINE (a ready engine object),
    TICKETREC_ENGINE_FACTORY (callable Settings → engine), TICKETREC_REPORT_ROOTS (folders searched for
    evaluation reports; default: TICKETREC_HOME/reports and the repository's docs/results).
    """
    app = Flask(__name__)
    app.json = StrictJSONProvider(app)
    app.request_class = StrictRequest
    test_config = dict(test_config or {})
    settings: Settings = test_config.get("TICKETREC_SETTINGS") or Settings.from_env()
    app.config.from_mapping(
        SECRET_KEY=test_config.get("SECRET_KEY") or auth.secret_key(settings),  # one key for every worker
        MAX_DESCRIPTION=settings.max_description,
        WTF_CSRF_TIME_LIMIT=None,  # a results page left open all day must still accept feedback
        JSON_SORT_KEYS=False,
        SESSION_COOKIE_SAMESITE="Lax",  # Secure too whenever the request came over HTTPS (auth.SessionInterface)
    )
    app.config.update(test_config)
    app.config["TICKETREC_SETTINGS"] = settings
    # A body far beyond the description limit is refused before it is read (413); the limit itself is checked per field.
    app.config.setdefault("MAX_CONTENT_LENGTH", int(app.config["MAX_DESCRIPTION"]) * 4 + _BODY_OVERHEAD)
    app.json.sort_keys = False

    app.extensions["ticketrec"] = TicketrecServices(
        settings, engine=app.config.get("TICKETREC_ENGINE"), engine_factory=app.config.get("TICKETREC_ENGINE_FACTORY"),
        report_roots=app.config.get("TICKETREC_REPORT_ROOTS")
    )
    csrf.init_app(app)
    auth.init_app(app)
    app.teardown_appcontext(lambda _exc: app.extensions["ticketrec"].close_store())

    from . import api, views

    app.register_blueprint(views.bp)
    app.register_blueprint(api.bp)
    csrf.exempt(api.bp)
    _register_error_handlers(app)
    _register_headers(app)

    @app.context_processor
    def _versions() -> dict[str, Any]:
        try:
            model_version, index_version = app.extensions["ticketrec"].versions()
        except Exception:  # the footer must render even on the error page of a broken engine
            model_version, index_version = "", ""
        return {"model_version": model_version, "index_version": index_version}

    return app


def _wants_json() -> bool:
    return request.path.startswith("/api/")


def _register_error_handlers(app: Flask) -> None:
    from .api import handle_http_error, json_error

    @app.errorhandler(CSRFError)
    def _csrf(exc: CSRFError):
        if _wants_json():
            return json_error(400, exc.description)
        message = "The form's security token is missing or expired. Reload the page and submit again."
        return render_template("error.html", status=400, title="Form expired", message=message), 400

    @app.errorhandler(HTTPException)
    def _http(exc: HTTPException):
        if _wants_json():
            return handle_http_error(exc)
        status = exc.code or 500
        return render_template("error.html", status=status, title=exc.name, message=exc.description), status

    @app.errorhandler(Exception)
    def _unexpected(exc: Exception):
        if isinstance(exc, HTTPException):  # pragma: no cover - routed above
            return _http(exc)
        log.exception("unhandled error on %s %s", request.method, request.path)
        message = "Something went wrong on the server; the error was logged. Try again, or tell the administrator."
        if _wants_json():
            return json_error(500, message)
        return render_template("error.html", status=500, title=InternalServerError.name, message=message), 500


def _register_headers(app: Flask) -> None:
    @app.after_request
    def _security_headers(response):
        response.headers.setdefault("X-Content-Type-Options", "nosniff")
        response.headers.setdefault("X-Frame-Options", "DENY")
        response.headers.setdefault("Referrer-Policy", "same-origin")
        response.headers.setdefault(
            "Content-Security-Policy",
            "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; frame-ancestors 'none'",
        )
        return response
