from verl_grpo_cli.main import main

main()
