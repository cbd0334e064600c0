from gelbridge.cli import main

main()
