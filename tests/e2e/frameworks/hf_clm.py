"""Causal language modelling with the Hugging Face Trainer, in the shape of run_clm.py:
resume from the last checkpoint in --output_dir, train, save the metrics and the state.
A tiny GPT-2 from a config on random tokens (nothing is downloaded)."""

import argparse
import os
import time

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments, set_seed
from transformers.trainer_utils import get_last_checkpoint


class RandomTokens(torch.utils.data.Dataset):
    def __init__(self, rows, length, vocab, seed):
        generator = torch.Generator().manual_seed(seed)
        self.tokens = torch.randint(0, vocab, (rows, length), generator=generator)

    def __len__(self):
        return len(self.tokens)

    def __getitem__(self, index):
        return {"input_ids": self.tokens[index], "labels": self.tokens[index]}


class Pace(TrainerCallback):
    """Keeps a step long enough to be interrupted mid-run."""

    def __init__(self, seconds):
        self.seconds = seconds

    def on_step_end(self, args, state, control, **kwargs):
        time.sleep(self.seconds)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--output_dir", default="clm-out")
    parser.add_argument("--max_steps", type=int, default=40)
    parser.add_argument("--save_steps", type=int, default=10)
    parser.add_argument("--step_seconds", type=float, default=0.1)
    args = parser.parse_args()

    training_args = TrainingArguments(
        output_dir=args.output_dir, max_steps=args.max_steps, save_steps=args.save_steps,
        per_device_train_batch_size=4, per_device_eval_batch_size=4, logging_steps=5, learning_rate=1e-3,
        report_to=[], seed=42, use_cpu=True, dataloader_num_workers=0,
    )
    last_checkpoint = None
    if os.path.isdir(training_args.output_dir):
        last_checkpoint = get_last_checkpoint(training_args.output_dir)
        if last_checkpoint is not None:
            print(f"Checkpoint detected, resuming training at {last_checkpoint}.", flush=True)
    set_seed(training_args.seed)
    config = GPT2Config(n_layer=2, n_head=2, n_embd=32, vocab_size=128, n_positions=32)
    model = GPT2LMHeadModel(config)
    trainer = Trainer(model=model, args=training_args, train_dataset=RandomTokens(256, 32, 128, 0),
                      eval_dataset=RandomTokens(32, 32, 128, 1), callbacks=[Pace(args.step_seconds)])
    train_result = trainer.train(resume_from_checkpoint=last_checkpoint)
    trainer.save_model()
    metrics = train_result.metrics
    trainer.log_metrics("train", metrics)
    trainer.save_metrics("train", metrics)
    trainer.save_state()
    metrics = trainer.evaluate()
    trainer.log_metrics("eval", metrics)
    trainer.save_metrics("eval", metrics)


if __name__ == "__main__":
    main()
