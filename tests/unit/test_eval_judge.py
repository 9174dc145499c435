"""The eval's judge, scores and thresholds, on texts whose answer is known."""

from __future__ import annotations

from pathlib import Path

import pytest

from knowledgeops.lab.eval.collections import load
from knowledgeops.lab.eval.judge import Answer, Scores, first_relevant
from knowledgeops.lab.eval.run import EvalReport, Requirement, Result

SECTION = (
    "8.5. How do I find out what package a particular file belongs to? To find the package "
    "that owns a file named foo, use dpkg --search foo, which searches the installed packages, "
    "or apt-file search foo, which also finds files of packages that are not installed."
)
OTHER = (
    "8.3. How can I find out what packages have already been installed? Run dpkg-query --list "
    "to see every installed package with its version and a short description."
)


def test_a_passage_mostly_inside_the_section_answers() -> None:
    answer = Answer.of(SECTION)
    assert answer.answered_by("use dpkg --search foo, which searches the installed packages")
    assert not answer.answered_by(OTHER)
    assert not answer.answered_by("")


def test_a_big_passage_holding_most_of_the_section_answers() -> None:
    answer = Answer.of(SECTION)
    assert answer.answered_by(OTHER + "\n\n" + SECTION + "\n\n" + OTHER * 3)
    assert not answer.answered_by(OTHER * 5 + SECTION[:60])  # a sliver of it is not enough


def test_the_judge_ignores_spacing_width_and_case_in_any_script() -> None:
    answer = Answer.of(
        "要获得名为 foo 的文件所属的软件包，可选择以下命令中的一个：dpkg --search foo"
    )
    assert answer.answered_by("要获得名为foo的文件所属的软件包,可选择以下命令中的一个")
    assert answer.answered_by("ＤＰＫＧ --SEARCH FOO 要获得名为 foo 的文件所属的软件包")


def test_scores_from_ranks() -> None:
    scores = Scores.of([1, 2, None, 7])
    assert (scores.questions, scores.r1, scores.r5) == (4, 0.25, 0.5)
    assert scores.mrr10 == pytest.approx((1 + 1 / 2 + 1 / 7) / 4, abs=1e-4)
    assert first_relevant(Answer.of(SECTION), [OTHER, SECTION[:120], SECTION]) == 2


def _report(figures: dict[str, float]) -> EvalReport:
    report = EvalReport(model="m", collections={"zh": 4, "en": 4})
    for name in ("zh", "en"):
        for mode, mrr in figures.items():
            scores = Scores(4, mrr, mrr, mrr if name == "zh" else 1.0)
            report.results.append(Result(name, mode, scores, scores, scores, 1.0, 2.0))
    return report


def test_requirements_compare_with_numbers_and_with_other_modes() -> None:
    report = _report({"vector": 0.4, "keyword": 0.8, "hybrid": 0.7, "llamaindex": 0.5})
    assert Requirement.parse("*:hybrid:mrr10>=0.6").check(report) == []
    short = Requirement.parse("*:hybrid:mrr10>=keyword").check(report)
    assert short == ["zh: hybrid mrr10 0.700, wanted >= 0.800 (*:hybrid:mrr10>=keyword)"]
    assert len(Requirement.parse("zh:hybrid:mrr10>=llamaindex+0.1").check(report)) == 0
    assert len(Requirement.parse("zh:hybrid:mrr10>=llamaindex+0.3").check(report)) == 1
    assert Requirement.parse("en:hybrid:r5<=0.5").check(report) == [
        "en: hybrid r5 0.700, wanted <= 0.500 (en:hybrid:r5<=0.5)"
    ]
    with pytest.raises(ValueError, match="COLLECTIONS:MODE:METRIC"):
        Requirement.parse("hybrid>=0.5")


def test_the_debian_faq_collections_ask_the_same_questions_in_every_language() -> None:
    root = Path(__file__).resolve().parents[2] / "eval"
    collections = {c.name: c for c in load(root)}
    assert set(collections) == {
        "debian-faq-en", "debian-faq-de", "debian-faq-fr", "debian-faq-zh-cn", "debian-faq-ja",
        "debian-faq-ko", "debian-faq-en>ja", "debian-faq-en>zh-cn", "debian-faq-en>ko",
    }  # fmt: skip
    en, ja, cross = (collections[n] for n in ("debian-faq-en", "debian-faq-ja", "debian-faq-en>ja"))
    assert len(en.questions) == len(ja.questions) == len(cross.questions) == 120
    assert [q.id for q in en.questions] == [q.id for q in cross.questions]
    assert cross.corpus == ja.corpus
    assert cross.documents == ja.documents
    assert en.questions[0].query.endswith("?")
    assert cross.questions[0].query == en.questions[0].query
    assert {q.split for q in en.questions} == {"dev", "test"}
