"""`kvtier dashboard`: start the Streamlit dashboard (loopback by default)"""

from kvtier.verbs import not_yet

SUMMARY = "start the Streamlit dashboard (loopback by default)"
EXAMPLE = "kvtier dashboard --segments kvtier-out/segments --port 8501"


def add_arguments(parser) -> None:
    parser.add_argument("--segments", default="kvtier-out/segments", help="Parquet segment folder to read")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default loopback)")
    parser.add_argument("--port", type=int, default=8501, help="port to serve on")


def run(args) -> int:
    raise not_yet("dashboard", 7, "the Streamlit dashboard")
