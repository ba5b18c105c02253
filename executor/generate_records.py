"""Write `executor/_record_methods.py`: `python -m executor.generate_records` (see executor.records).

Run it after adding or changing a class made with `executor.records.dataclass`;
tests/executor/test_records.py fails until the file is current.
"""

import sys

from executor.records import generated_module_path, generated_module_text


def main() -> None:
    text = generated_module_text()
    with open(generated_module_path(), "w") as handle:
        handle.write(text)
    print(f"wrote {generated_module_path()}: {text.count('def _make_')} shapes", file=sys.stderr)


if __name__ == "__main__":
    main()
