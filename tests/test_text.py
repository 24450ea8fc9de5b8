"""Text processing: tokenisation without NLTK data, number masking, the trained Punkt splitter."""
from recommender.errors import ModelError
from recommender.lexical.analyzer import NUMBER_TOKEN, clean, content_words, tokenize
from recommender.model.sentences import SentenceSplitter

import pytest


def test_tokenize_lowercases_masks_numbers_and_drops_punctuation():
    assert tokenize("The GT tripped at 50.5 MW, again!") == ["the", "gt", "tripped", "at", NUMBER_TOKEN, "mw", "again"]


def test_tokenize_strips_html_and_unescapes_entities():
    assert tokenize("<script>alert(1)</script> Oil &amp; <b>gas</b>") == ["alert", NUMBER_TOKEN, "oil", "gas"]


def test_tokenize_empty_and_none_like_inputs():
    assert tokenize("") == []
    assert tokenize("   \n\t ") == []
    assert clean(None) == ""  # type: ignore[arg-type]


def test_content_words_drop_stop_words_and_masks():
    assert content_words(tokenize("The valve is leaking at 12 bar")) == ["valve", "leaking", "bar"]


def test_punkt_learns_abbreviations_from_the_corpus_and_round_trips(tmp_path):
    corpus = ["Approx. ten units were checked. The unit tripped again. Approx. two hours later it restarted."] * 30
    splitter = SentenceSplitter.train(corpus)
    text = "Approx. five valves leaked. The operator closed them."
    assert splitter.split(text) == ["Approx. five valves leaked.", "The operator closed them."]
    path = tmp_path / "punkt.json"
    splitter.save(path)
    assert SentenceSplitter.load(path).split(text) == splitter.split(text)


def test_untrained_splitter_splits_sentences_and_empty_text():
    splitter = SentenceSplitter()
    assert splitter.split("One. Two. Three.") == ["One.", "Two.", "Three."]
    assert splitter.split("") == []


def test_corrupt_punkt_file_gives_a_clear_error(tmp_path):
    path = tmp_path / "punkt.json"
    path.write_text("{not json")
    with pytest.raises(ModelError, match="punkt.json"):
        SentenceSplitter.load(path)


def test_sentence_internal_periods_do_not_stick_to_words_and_masks_survive():
    tokens = tokenize("Checked the seal. Inspection done at ## bar by XXXX. O-ring isn't worn.")
    assert tokens == ["checked", "the", "seal", "inspection", "done", "at", NUMBER_TOKEN, "bar", "by", "xxxx",
                      "o-ring", "isn't", "worn"]


def test_remembered_punkt_decisions_split_exactly_like_punkt():
    from nltk.tokenize.punkt import PunktSentenceTokenizer

    from recommender.data.synthetic import generate

    texts = [t.description for t in generate(n_tickets=150, n_queries=0, seed=3).tickets]
    texts += ["Dr. Smith checked the valve. It was fine.", "See e.g. the manual. Then restart.", "No end"]
    splitter = SentenceSplitter.train(texts)
    plain = PunktSentenceTokenizer(splitter.params)
    expected = [[s for s in plain.tokenize(clean(t)) if s.strip()] for t in texts]
    assert [splitter.split(t) for t in texts] == expected
    assert [splitter.split(t) for t in texts] == expected  # the second pass answers from memory
    assert splitter._tokenizer._decisions  # decisions were remembered
