"""Cross-validated accuracy of a support vector classifier for one value of C, as the
scikit-learn user guide computes it (cross_val_score), written to metrics.json beside it."""

import argparse
import json
import time

from sklearn import datasets, svm
from sklearn.model_selection import cross_val_score


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--C", type=float, default=1.0)
    parser.add_argument("--pause", type=float, default=0.0)
    args = parser.parse_args()
    X, y = datasets.load_digits(return_X_y=True)
    time.sleep(args.pause)  # stands in for a longer fit: room to be interrupted
    scores = cross_val_score(svm.SVC(kernel="rbf", C=args.C, gamma=0.001), X, y, cv=5)
    print("%0.4f accuracy with a standard deviation of %0.4f" % (scores.mean(), scores.std()))
    with open("metrics.json", "w") as f:
        json.dump({"accuracy": scores.mean(), "std": scores.std(), "C": args.C}, f)


if __name__ == "__main__":
    main()
