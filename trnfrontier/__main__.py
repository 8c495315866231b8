from trnfrontier.cli.app import main

main()
