"""``hpd serve``: a long-lived HTTP search service over the promoted index (:mod:`tasks.serve.app`), the
holder that hot-swaps it when ``indexes/current.json`` moves (:mod:`tasks.serve.holder`), and the client
``hpd search`` tries first (:mod:`tasks.serve.client`)."""
