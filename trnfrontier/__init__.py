"""trnfrontier (`trnf`): the daily tool of an AWS Trainium Frontier team.

Two layers: ``trnfrontier.runtime`` is what a submission carries (stdlib, torch,
numpy and the trusted prepare.py only); everything else is the tool around it.
"""

__version__ = "0.1.0"
