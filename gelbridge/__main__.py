from gelbridge._cli import main

main()
