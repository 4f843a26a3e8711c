"""synthetic://arith: the held-out problems never appear in training, and the GSM8K rule scores them."""
from rlx.reward.functions import default_compute_score
from rlx.data.synthetic import generate_rows


def _questions(path):
    return {r["prompt"][0]["content"] for r in generate_rows(path)}


def test_test_split_is_held_out_from_train_whatever_the_seeds():
    train = _questions("synthetic://arith/size:20000/seed:0")
    test = _questions("synthetic://arith/size:500/seed:0/split:test")
    assert len(test) > 300 and not train & test
    assert any("*" in q for q in test) and any("+" in q for q in test)


def test_rows_are_scored_by_the_gsm8k_rule():
    row = generate_rows("synthetic://arith/size:3/seed:1")[0]
    truth = row["reward_model"]["ground_truth"]
    assert row["data_source"] == "synthetic/arith" and '"####"' in row["prompt"][0]["content"]
    assert default_compute_score("synthetic/arith", f"so #### {truth}", truth, row["extra_info"]) == 1.0
    assert default_compute_score("synthetic/arith", f"so #### {int(truth) + 1}", truth, row["extra_info"]) == 0.0
    assert default_compute_score("synthetic/arith", truth, truth, row["extra_info"]) == 0.0  # no "#### ": no answer
