"""The asyncio Producer, one module per concern (``smartnsq.Producer`` is the public name).

=============== ==========================================================================
``producer``    the :class:`~smartnsq.producer.producer.Producer`: public calls, lifecycle,
                the thin I/O shell
``config``      ``ProducerConfig``: each field's doc and range check in one place
``results``     ``PublishResult``, ``BatchResult``
``validation``  the arguments of a call, checked once before anything is sent
``routing``     which partition and leader an attempt goes to (plain functions)
``encoding``    which command bytes for which kind of node (via ``smartnsq.protocol``)
``retry``       the one retry decision of every call, a plain function of the failure,
                the attempt and the time left
``request``     one call in progress, as one slotted object
``linger``      the batch a lingering publish joins
=============== ==========================================================================
"""
