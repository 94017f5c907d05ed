"""The Streamlit dashboard over the store and the recommendations."""
