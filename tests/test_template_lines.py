"""Template lines: the lines of a form that recur across a knowledge base's tickets, learnt and left out."""
from recommender.data.records import Query, Ticket
from recommender.model.template_lines import TemplateLines, learn_template_lines, line_key, strip_lines

FORM = "Steps to reproduce:\n{body}\nUser Agent: Mozilla/5.0 (Windows NT 10.0; rv:{v}.0) SeaMonkey/2.53.{v}"


def _tag(i: int) -> str:
    """A word of its own for ticket i (letters: digits would make every body one line up to digits)."""
    return chr(97 + i % 26) + chr(97 + i // 26 % 26)


def _descriptions(n: int = 40) -> list[str]:
    return [FORM.format(body=f"the sidebar {_tag(i)} turns blank after a restart", v=i % 7) for i in range(n)]


def test_a_line_is_compared_up_to_case_white_space_and_digits():
    assert line_key("  User  Agent: Mozilla/5.0 (rv:60.0)\t") == line_key("user agent: mozilla/5.1 (rv:68.12)")
    assert line_key("Steps to reproduce:") != line_key("Steps to reproduce")


def test_form_lines_are_learnt_and_content_lines_are_not():
    lines = learn_template_lines(_descriptions())
    assert line_key("Steps to reproduce:") in lines
    assert line_key("User Agent: Mozilla/5.0 (Windows NT 10.0; rv:3.0) SeaMonkey/2.53.3") in lines
    assert not any("sidebar" in key for key in lines)


def test_a_text_repeated_whole_is_never_a_template_line():
    """Reposts (the very duplicates ticketrec looks for) are whole texts of one line, never counted."""
    texts = ["My residence visa was rejected; what now?"] * 30 + [f"line {_tag(i)}\nother {_tag(i)}" for i in range(10)]
    assert learn_template_lines(texts) == []


def test_a_line_must_recur_in_the_share_and_in_at_least_min_tickets():
    texts = [f"Thanks in advance\nquestion {_tag(i)}" for i in range(4)]
    texts += [f"body {_tag(i)}\nmore {_tag(i)}" for i in range(600)]
    assert learn_template_lines(texts, min_share=0.0, min_tickets=5) == []  # 4 tickets: too few
    assert learn_template_lines(texts, min_share=0.0, min_tickets=4) == ["thanks in advance"]
    assert "thanks in advance" not in learn_template_lines(texts, min_share=0.01, min_tickets=4)  # 4 < 1 % of 604
    assert learn_template_lines([""] * 50 + texts[:4], min_share=0.5, min_tickets=1) == ["thanks in advance"]  # of filled


def test_stripping_leaves_out_template_lines_and_keeps_the_rest():
    template = frozenset(learn_template_lines(_descriptions()[:20] + [f"x {_tag(i)}\ny {_tag(i)}" for i in range(20)], 0.4))
    text = "Steps to reproduce:\n\nOpen the mail window.\nUser Agent: Mozilla/5.0 (Windows NT 6.1; rv:91.0) SeaMonkey/2.53.17"
    assert strip_lines(text, template) == "Open the mail window."
    unchanged = "Open the mail window.\nIt crashes."
    assert strip_lines(unchanged, template) is unchanged
    assert strip_lines("Steps to reproduce:", template) == ""


def test_template_lines_strip_a_ticket_or_query_per_field_and_survive_a_round_trip():
    tickets = [Ticket(f"t{i}", f"subject {i}", d, "Closed by the bot.\nfixed in build {i}".format(i=i))
               for i, d in enumerate(_descriptions())]
    template = TemplateLines.learn(tickets, min_share=0.5)
    assert line_key("Steps to reproduce:") in template.lines["description"]
    assert template.lines["solution"] == {"closed by the bot.", "fixed in build 0"}
    ticket = tickets[3]
    stripped = template.strip(ticket)
    assert stripped.subject == ticket.subject and "Steps to reproduce" not in stripped.description
    assert stripped.solution == ""
    query = Query("Steps to reproduce:", "Steps to reproduce:\nThe sidebar is blank")
    assert template.strip(query).subject == "Steps to reproduce:"  # a subject is never filtered
    assert template.strip(query).description == "The sidebar is blank"
    clean = Ticket("c", "s", "nothing of the form", "")
    assert template.strip(clean) is clean
    again = TemplateLines.from_dict(template.to_dict())
    assert again == template and len(again) == len(template)
    assert TemplateLines.from_dict(None) is None
