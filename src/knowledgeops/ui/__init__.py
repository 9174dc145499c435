"""The dashboard at /ui: server-rendered pages (Jinja2) over the same use cases as the API, with
htmx for partial updates and its SSE extension for live rows (docs/architecture.md: The
dashboard). No build step: the two scripts are vendored in static/vendor with their licences."""
