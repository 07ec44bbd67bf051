"""``python -m lit_treegrpo {fit,validate,test,predict} --config FILE [--section.key value ...]``."""

from .cli import main

if __name__ == "__main__":
    main()
