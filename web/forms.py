"""The HTML forms (Flask-WTF: CSRF token on every form) and the input rules shared with the JSON API."""
from __future__ import annotations

from flask import current_app
from flask_wtf import FlaskForm
from wtforms import HiddenField, PasswordField, StringField, TextAreaField
from wtforms.validators import DataRequired, Length, ValidationError

from recommender.data.records import check_text
from recommender.errors import InputError

#: Longest accepted subject, in characters (subjects are a few words).
MAX_SUBJECT = 1000
LABELS = ("YES", "REL", "NO")
#: Ticket ids one page of the API's ticket list holds by default, and at most.
DEFAULT_PAGE, MAX_PAGE = 100, 1000


def max_description() -> int:
    """The configured longest description (settings.max_description)."""
    return int(current_app.config["MAX_DESCRIPTION"])


def unicode_text(form, field) -> None:
    """Refuse a field that is not Unicode text (a lone surrogate; `records.check_text`), before anything stores it."""
    try:
        check_text(field.data or "", f"The {field.label.text.lower() or field.name}", todo="retype it")
    except InputError as exc:
        raise ValidationError(f"{exc}.") from None


def _description_not_too_long(form, field) -> None:
    limit = max_description()
    if field.data and len(field.data) > limit:
        raise ValidationError(
            f"The description has {len(field.data):,} characters; the limit is {limit:,}. "
            "Shorten it to the part that describes the problem."
        )


class SearchForm(FlaskForm):
    """SUBJECT + DESCRIPTION of a new ticket."""

    subject = StringField(
        "Subject",
        validators=[DataRequired("Enter the ticket's subject (a few words)."),
                    Length(max=MAX_SUBJECT, message=f"Keep the subject under {MAX_SUBJECT:,} characters."), unicode_text],
    )
    description = TextAreaField(  # optional: a subject alone is a valid query
        "Description", default="",
        validators=[_description_not_too_long, unicode_text],
    )


def _label_and_ticket(form, field) -> None:
    label, _, ticket_id = (field.data or "").partition(" ")
    if label not in LABELS or not ticket_id:
        raise ValidationError("Choose YES, REL or NO on one result.")


class LoginForm(FlaskForm):
    """An engineer's name and password (accounts: `ticketrec user add NAME`); `next` is where to go afterwards."""

    name = StringField("User name", validators=[DataRequired("Enter your user name."), Length(max=64)])
    password = PasswordField("Password", validators=[DataRequired("Enter your password."), Length(max=1024)])
    next = HiddenField(default="")


class FeedbackForm(FlaskForm):
    """Judgements of the results of one query: one form around all result cards, whose buttons send
    `choice = "<LABEL> <ticket id>"`."""

    subject = HiddenField(validators=[DataRequired(), Length(max=MAX_SUBJECT), unicode_text])
    description = HiddenField(default="", validators=[_description_not_too_long, unicode_text])
    choice = StringField(validators=[DataRequired("Choose YES, REL or NO on one result."), _label_and_ticket,
                                     unicode_text])

    @property
    def label(self) -> str:
        return self.choice.data.partition(" ")[0]

    @property
    def ticket_id(self) -> str:
        return self.choice.data.partition(" ")[2]
