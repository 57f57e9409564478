from shardscope.cli import app

# Guarded: a search's worker processes started by "spawn" (macOS, Windows) import this module again.
if __name__ == "__main__":
    app(prog_name="shardscope")
