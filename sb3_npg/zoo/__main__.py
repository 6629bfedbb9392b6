"""``python -m sb3_npg.zoo <script> ...``: see :mod:`sb3_npg.zoo.cli`."""

from sb3_npg.zoo.cli import main

if __name__ == "__main__":
    main()
