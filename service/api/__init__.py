"""The HTTP interface: routers, request/response schemas, errors, middleware, metrics."""
