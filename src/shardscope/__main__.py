from shardscope.cli import app

app(prog_name="shardscope")
