"""`python -m knowledgeops.cli`, as `kops`."""

from knowledgeops.cli.app import main

main()
