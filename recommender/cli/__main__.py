"""`python -m recommender.cli`: the `ticketrec` command."""
from . import main

if __name__ == "__main__":
    main()
