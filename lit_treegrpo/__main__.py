"""``python -m lit_treegrpo {fit,validate,test,predict,export} --config FILE [--section.key value ...]``."""

from .cli import main

if __name__ == "__main__":
    main()
