"""The numbers a write-up states that no record holds (labrun.prose_numbers): honest writing,
in every way careful researchers write numbers, lists nothing; an invented number, plain or
hidden, is listed."""

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from labrun.prose_numbers import Record, Stated, stated, unrecorded

# What the engine recorded for the honest corpus: metrics, claim values (a CI's ends), a
# duration, a literature value the idea states, and the difference of two claimed accuracies.
RECORD = Record(
    values=(0.9712, 0.898, 0.794, 0.7312, -0.50163, 7.45e-14, 3.1e-4, 0.876, 0.916, 0.8763, 0.9159,
            0.71, 0.75, 0.077, 0.132, 0.2, 12345.6, 1.96, 0.0302, 0.912),
    differences=(0.104,),
)

# (text, latex, (a number of it, an invented number to put in its place) or None)
HONEST = [
    ("The classifier reached an accuracy of 0.9712 on the held-out set.", False, ("0.9712", "0.9734")),
    ("Accuracy was 0.97 after rounding.", False, ("0.97", "0.95")),
    ("It answered 89.8 percent of the questions.", False, ("89.8", "91.3")),
    ("It answered 89.8 per cent of the questions.", False, ("89.8", "91.3")),
    ("Accuracy was 89.8% (95% CI 87.6–91.6%).", False, ("91.6", "93.4")),
    ("The gain was 10.4 percentage points (7.7 to 13.2).", False, ("13.2", "14.9")),
    ("Ours beats the baseline by 10.4 pp.", False, ("10.4", "12.7")),
    ("An improvement of 10.4 points over the baseline.", False, ("10.4", "12.7")),
    ("The difference is significant (p < 0.001).", False, ("0.001", "1e-20")),
    ("Significant at p<.05 on every split.", False, (".05", ".00000000000001")),
    ("A two-sided test gives p = 7.45 × 10⁻¹⁴.", False, ("7.45", "6.21")),
    ("A two-sided test gives p = 7.45 x 10^-14.", False, ("7.45", "6.21")),
    ("A two-sided test gives p = 7.45·10⁻¹⁴.", False, ("7.45", "6.21")),
    ("The planned learning rate was 3.1e-4.", False, ("3.1e-4", "4.7e-4")),
    ("AUC was 0.731 [0.71, 0.75].", False, ("0.75", "0.78")),
    ("AUC was 0.731 (95% CI 0.71-0.75).", False, ("0.71", "0.68")),
    ("Each epoch took 0.2 s on one GPU.", False, ("0.2 s", "0.3 s")),
    ("Throughput was 12,345.6 tokens/s.", False, ("12,345.6", "12,346.9")),
    ("The test statistic is z = 1.96.", False, ("1.96", "2.58")),
    ("We used Python 3.11, torch 2.3.1, numpy v2.1.0 and version 1.2 of the data.", False, None),
    ("As Section 4.1, §4.2, Table 2.3, Fig. 1.2 and Eq. (3.2) show, the slope is -0.5016.", False,
     ("-0.5016", "-0.5071")),
    ("The slope was −0.5016, a magnitude of 0.50.", False, ("0.50", "0.53")),
    ("The original paper reports 0.912 ([Lee 2023](https://arxiv.org/abs/2301.01234), doi:10.1234/abc.5678).",
     False, ("0.912", "0.934")),
    ("| Method | Accuracy (%) |\n|---|---|\n| ours | 89.8 |\n| baseline | 79.4 |\n", False, ("79.4", "81.7")),
    ("| Method | Acc. (%) | 95% CI (%) |\n|---|---|---|\n| ours, seed 4 | 89.8 | 87.6–91.6 |\n", False, ("91.6", "93.4")),
    ("| Method | Acc. (%) |\n|---|---|\n| ours | **89.8** |\n", False, ("89.8", "93.4")),
    ("\\begin{tabular}{ll} Method & Acc. (\\%) \\\\ ours & \\textbf{89.8} \\\\ \\end{tabular}", True, ("89.8", "93.4")),
    ("\\begin{tabular}{lll} Method & Acc. (\\%) & CI (\\%) \\\\ ours & 89.8 & 87.6--91.6 \\\\ \\end{tabular}", True,
     ("91.6", "93.4")),
    ("| Method | Acc | F1 |\n|:--|--:|--:|\n| ours | 0.9712 | 0.731 |\n", False, ("0.731", "0.744")),
    ("```\n$ python3 src/eval.py\nacc = 0.9712\n```\n", False, ("0.9712", "0.9734")),
    ("We ran `python3 src/train.py --lr 0.001 --seed 3` and `results/run_0.5/metrics.json` holds 0.9712.",
     False, ("holds 0.9712", "holds 0.9734")),
    ("Run on 2024-05-01 at 14:30:05.25 with 12,345 samples, seed 42, 3 runs.", False, None),
    ("<!-- labrun:header -->\nrerun gives 0.123456\n<!-- /labrun:header -->\nAccuracy 0.9712.", False,
     ("Accuracy 0.9712", "Accuracy 0.9734")),
    ("The loss plateaued.[^1]\n\n[^1]: Final loss 0.0302.\n", False, ("0.0302", "0.0417")),
    ("Accuracy rose from 79.4% to 89.8%, a gain of 0.104.", False, ("0.104", "0.117")),
    ("Accuracy 0.9712 ± 0.0302 over seeds; <b>0.9712</b> at best; .971 rounded.", False, (".971", ".984")),
    ("Qwen2.5, GPT-3.5 and Llama 3.1 are not evaluated here.", False, None),
    ("Accuracy $0.9712$ ($89.8\\%$; 95\\% CI 0.8763--0.9159).", True, ("0.9159", "0.9377")),
    ("$p = 7.45\\times10^{-14}$ and $p<0.001$; $p \\le 10^{-3}$.", True, ("7.45", "6.21")),
    ("\\num{0.9712}, \\SI{89.8}{\\percent} and \\SI{0.2}{\\second} per epoch.", True, ("89.8", "91.3")),
    ("\\documentclass[11pt]{article}\n\\usepackage[margin=2.5cm]{geometry}\n\\newcommand{\\acc}{0.9712}\n"
     "\\renewcommand{\\arraystretch}{1.2}\n\\begin{document}\nAccuracy \\acc{} (Section~4.1, Python~3.11).\n"
     "% a draft value 0.777\n\\includegraphics[width=0.5\\linewidth]{fig_0.5.pdf}\\vspace{-0.3em}\n\\end{document}\n",
     True, ("0.9712", "0.9734")),
    ("\\begin{table}[t]\\caption{Accuracy (\\%).}\\begin{tabular}{lc}\\toprule Method & Acc. \\\\ \\midrule "
     "ours & 89.8 \\\\ baseline & 79.4 \\\\ \\bottomrule\\end{tabular}\\end{table}", True, ("79.4", "81.7")),
    ("The gap is $10.4$ percentage points ($7.7$ to $13.2$), $z = 1.96$.", True, ("1.96", "2.58")),
]


@pytest.mark.parametrize("text,is_latex,swap", HONEST)
def test_honest_writing_lists_nothing(text, is_latex, swap):
    assert unrecorded(text, RECORD, latex=is_latex) == []


@pytest.mark.parametrize("text,is_latex,swap", [h for h in HONEST if h[2]])
def test_an_invented_number_is_listed(text, is_latex, swap):
    old, new = swap
    assert old in text
    listed = unrecorded(text.replace(old, new, 1), RECORD, latex=is_latex)
    number = next(w for w in new.split() if any(c.isdigit() for c in w))
    assert len(listed) == 1 and number in listed[0].written, listed


def test_the_honest_corpus_reads_its_numbers():
    """Not listing is not the same as not reading: the honest corpus states result numbers
    of every kind, and each is held by the record."""
    kinds = {s.kind for text, is_latex, _ in HONEST for s in stated(text, is_latex)}
    assert kinds == {"value", "percent", "points", "bound", "range_end"}
    assert sum(len(stated(text, is_latex)) for text, is_latex, _ in HONEST) > 60


def test_kinds_units_lines_and_written_forms():
    text = ("Intro.\nAccuracy 89.8% and 0.73;\n\n10.4 percentage points (7.7 to 13.2), p ≤ 0.01,\n"
            "range 0.8763--0.9159 and [-0.12, 0.35].\n")
    got = [(s.line, s.written, s.kind, s.unit, s.relation, s.signed) for s in stated(text)]
    assert got == [(2, "89.8%", "percent", "%", "", False), (2, "0.73", "value", "", "", False),
                   (4, "10.4 percentage points", "points", "pp", "", False),
                   (4, "7.7", "range_end", "pp", "", False), (4, "13.2", "range_end", "pp", "", False),
                   (4, "≤ 0.01", "bound", "", "<=", False),
                   (5, "0.8763", "range_end", "", "", False), (5, "0.9159", "range_end", "", "", False),
                   (5, "-0.12", "range_end", "", "", True), (5, "0.35", "range_end", "", "", False)]


def test_precision_written():
    """`0.73` is 0.725..0.735; `0.9712` is 0.97115..0.97125; an unsigned number either sign."""
    def listed(text, *values):
        return [s.written for s in unrecorded(text, Record(values))]
    assert listed("0.73", 0.7312) == listed("0.73", 0.7299) == listed("0.73", -0.7312) == []
    assert listed("0.73", 0.74) == ["0.73"]
    assert listed("0.9712", 0.97115) == listed("0.9712", 0.97125) == []
    assert listed("0.9712", 0.97114) == listed("0.9712", 0.97126) == ["0.9712"]
    assert listed("-0.73", 0.7312) == ["-0.73"]
    assert listed("89.8%", 0.898) == listed("89.8%", 89.8) == []
    assert listed("89.8%", 0.8988) == ["89.8%"]
    assert listed("a gap of 10.4 points", 0.5) == ["10.4 points"]
    assert unrecorded("a gap of 10.4 points", Record((0.5,), differences=(-0.1041,))) == []
    assert listed("p < 0.001", 0.02) == ["< 0.001"]
    assert listed("accuracy > 0.9", 0.93) == [] and listed("accuracy > 0.9", 0.87) == ["> 0.9"]


HIDDEN = [
    ("Accuracy 0&#46;9734.", False), ("Accuracy 0&#x2E;9734.", False), ("Accuracy 0,9734.", False),
    ("Accuracy ０．９７３４.", False), ("Accuracy ٠٫٩٧٣٤.", False), ("Accuracy 0.97\u200b34.", False),
    ("Accuracy 0.97\u00ad34.", False), ("Accuracy 0\\.9734.", False), ("Accuracy <span>0.9734</span>.", False),
    ("<!-- the real one: 0.9734 -->", False), ("| a | b |\n|---|---|\n| x | 0.9734 |\n", False),
    ("```\nprint(0.9734)\n```\n", False), ("Done.[^1]\n\n[^1]: 0.9734\n", False),
    ("\\documentclass{article}\n\\newcommand{\\acc}{0.9734}\n\\begin{document}\\acc\\end{document}", True),
    ("\\def\\acc{0.9734} Accuracy \\acc.", True), ("\\pgfmathsetmacro{\\acc}{0.9734}", True),
    ("\\num{0.9734}", True), ("\\SI{0.9734}{}", True), ("\\qty{97.34}{\\percent}", True),
    ("0.97{}34", True), ("0.\\,9734", True), ("0{,}9734", True), ("0.97{3}4", True),
    ("\\textcolor{red}{0.9734}", True), ("\\multicolumn{2}{c}{0.9734}", True), ("\\multirow{2}{*}{0.9734}", True),
]


@pytest.mark.parametrize("text,is_latex", HIDDEN)
def test_a_hidden_number_is_listed(text, is_latex):
    listed = unrecorded(text, RECORD, latex=is_latex)
    assert [round(s.value * (0.01 if s.unit else 1), 6) for s in listed] == [0.9734], listed


def test_not_result_numbers():
    text = ("Python 3.11 and v2.1.0, torch 2.3.1, `pip install numpy==1.26` and transformers>=4.40; version 1.2.\n"
            "Section 4.1, §4.1, Sections 4.1 and 4.2, Table 2.3, Eq. (3.2), Fig. 1.2, Appendix A.2.\n"
            "See https://example.org/v0.5/data?x=0.3, [a](http://x.io/1.5), arXiv:2301.01234, 2301.01234, "
            "doi:10.48550/arXiv.2301.01234 and `outputs/lr_0.01/m.json`.\n"
            "On 2024-05-01 at 14:30:05.25, at 09:15; 95% CI, 90% confidence, 95 % credible interval.\n"
            "12,345 samples, 2024, seeds 0,1,2 and (0,1); 5 points on the scale.\n"
            "## 3.2 Results\n")
    assert stated(text) == []
    assert stated("\\begin{tabular}{p{2.5cm}c}\\hline\\end{tabular}\\setlength{\\tabcolsep}{4pt}"
                  "\\label{sec:4.1}\\cite[p.~1.5]{a}\\hspace{0.5em}\\ref{t:2.3}", latex=True) == []


def test_integers_count_only_as_percentages_or_points():
    assert [s.written for s in stated("91% of runs, a 12 pp gain, 12 points, 87–91%, 3 of 5")] == [
        "91%", "12 pp", "87", "91%"]


SATURATED = random.Random(7)


def test_a_large_record_still_lists_an_invented_number():
    """300 claim and metric values at 4 decimals leave most 4-decimal numbers unmatched: an
    invented 0.8374 is listed. A per-item predictions file is never part of a Record: its
    50,000 numbers would match almost any number at the precision written (shown below);
    a number written to 2 decimals is weakly checked against a large record either way."""
    values = []
    while len(values) < 300:
        v = round(SATURATED.random(), 4)
        if abs(v - 0.8374) > 0.0002:
            values.append(v)
    record = Record(tuple(values))
    assert [s.written for s in unrecorded("Accuracy 0.8374.", record)] == ["0.8374"]
    assert unrecorded("Accuracy 0.84.", record) == []  # the limit of a 2-decimal statement
    predictions = Record(tuple(SATURATED.random() for _ in range(50_000)))
    assert unrecorded("Accuracy 0.8374.", predictions) == []


@settings(max_examples=150, deadline=None)
@given(x=st.floats(min_value=-1e9, max_value=1e9, allow_nan=False), decimals=st.integers(2, 6),
       percent=st.booleans(), grouped=st.booleans(), others=st.lists(st.floats(-1e3, 1e3), max_size=5))
def test_a_recorded_value_at_any_precision_is_never_listed(x, decimals, percent, grouped, others):
    written = f"{x * 100 if percent else x:{',' if grouped else ''}.{decimals}f}" + ("%" if percent else "")
    for text in (f"The accuracy was {written}.", f"| run | score |\n|---|---|\n| a | {written} |\n"):
        assert unrecorded(text, Record((*others, x))) == [], written
    assert unrecorded(f"Accuracy ${written.replace('%', chr(92) + '%')}$.", Record((x,)), latex=True) == []


def test_stated_is_a_value():
    s = stated("89.8%")[0]
    assert isinstance(s, Stated) and s.readings[0][0] == 89.8 and abs(s.readings[1][0] - 0.898) < 1e-12
