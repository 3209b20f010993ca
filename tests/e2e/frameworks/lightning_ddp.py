"""A LightningModule trained with DDP on two CPU processes by Lightning's own launcher,
checkpointing with ModelCheckpoint and resuming with ckpt_path="last"; CSVLogger keeps
metrics.csv."""

import argparse
import time

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import CSVLogger
from torch.utils.data import DataLoader, TensorDataset


class Regressor(L.LightningModule):
    def __init__(self, step_seconds):
        super().__init__()
        self.layer = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
        self.step_seconds = step_seconds

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.layer(x), y)
        self.log("train_loss", loss)
        time.sleep(self.step_seconds)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", torch.nn.functional.mse_loss(self.layer(x), y), sync_dist=True)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)


def loaders():
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(256, 8, generator=generator)
    y = x.sum(dim=1, keepdim=True) * 0.3
    return DataLoader(TensorDataset(x[:192], y[:192]), batch_size=8), DataLoader(TensorDataset(x[192:], y[192:]),
                                                                                   batch_size=16)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--max_epochs", type=int, default=3)
    parser.add_argument("--step_seconds", type=float, default=0.05)
    args = parser.parse_args()
    L.seed_everything(7)
    checkpoints = ModelCheckpoint(dirpath="checkpoints", every_n_train_steps=10, save_last=True, save_top_k=-1)
    trainer = L.Trainer(accelerator="cpu", devices=2, strategy="ddp", max_epochs=args.max_epochs,
                        callbacks=[checkpoints], logger=CSVLogger("logs", name="regressor", version=0),
                        enable_progress_bar=False, log_every_n_steps=5)
    train, val = loaders()
    trainer.fit(Regressor(args.step_seconds), train, val, ckpt_path="last")


if __name__ == "__main__":
    main()
