"""Write an image tree as MXNet RecordIO or TFRecord files for DALI's record readers.

    python scripts/data/make_records.py --image-root DIR --output DIR --format recordio|tfrecord

See paddle_resnet/data/records.py for the files it writes.
"""

import argparse
import sys

from paddle_resnet.core.errors import exit_status
from paddle_resnet.data.records import FORMATS, write_records


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--image-root", required=True, help="folder holding train/<class>/* and/or val/<class>/*"
    )
    parser.add_argument(
        "--output",
        required=True,
        help="folder for the record files, their indexes and classes.json",
    )
    parser.add_argument("--format", required=True, choices=FORMATS)
    args = parser.parse_args()
    for path in write_records(args.image_root, args.output, args.format):
        print(path)


if __name__ == "__main__":
    sys.exit(exit_status(main))
