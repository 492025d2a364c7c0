"""Admission: what the node lets in from HTTP clients. ``fair`` shares the node's route
handlers between applications by their fairness weights; ``submit_rate`` holds each
application to its share of its submit rate limit."""
