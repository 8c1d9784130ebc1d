from srpo_cli.app import main

main()
