"""The rlserve server: carriers (TCP, HTTP), the service they share, and the learner link."""
