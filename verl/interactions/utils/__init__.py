"""Loading the interactions a multi-turn run declares (``verl.interactions.utils.interaction_registry``)."""
