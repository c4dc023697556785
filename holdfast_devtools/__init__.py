"""Development tools: never part of a deployment.

* ``processes``: start sandbox hosts, Celery workers and other children on this
  machine, each ready by one rule (its readiness line), for the demos (``manage.py
  demo``, ``demo_deploy``), ``bench/`` and the tests alike;
* ``balancer``: a TCP balancer with deregistration delays, standing in for a cloud load
  balancer in the demos and the tests.

Production runs hosts and workers from the Procfile, behind a real balancer.
"""
