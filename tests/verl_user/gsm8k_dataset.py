"""A verl dataset class that reads raw GSM8K jsonl ({question, answer}) with HF datasets and maps each record to
verl's row (as verl-recipe's retool dataset maps AIME), and a second one that builds each prompt from its row."""
import datasets

from verl.utils.dataset import RLHFDataset

SYSTEM = "Solve the problem. End with '#### <answer>'."


def to_row(example, idx, data_source):
    truth = example["answer"].split("####")[-1].strip().replace(",", "")
    return {
        "data_source": data_source,
        "prompt": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": example["question"]}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": truth},
        "extra_info": {"index": idx, "tools_kwargs": {"check_answer": {"create_kwargs": {"ground_truth": truth}}}},
    }


class Gsm8kJsonDataset(RLHFDataset):
    def _read_files_and_tokenize(self):
        frames = []
        for path in self.data_files:
            frame = datasets.load_dataset("json", data_files=path)["train"]
            frame = frame.map(to_row, with_indices=True, fn_kwargs={"data_source": "openai/gsm8k"},
                              remove_columns=frame.column_names)
            frames.append(frame)
        self.dataframe = datasets.concatenate_datasets(frames)
        print(f"dataset len: {len(self.dataframe)}")
        self.dataframe = self.maybe_filter_out_long_prompts(self.dataframe)


class QuestionColumnDataset(RLHFDataset):
    """Rows read by the base class; each prompt built from the row's `question` in extra_info."""

    def _build_messages(self, example):
        question = example["extra_info"]["question"]
        return [{"role": "system", "content": self.config.get("system_prompt", SYSTEM)},
                {"role": "user", "content": question}]
