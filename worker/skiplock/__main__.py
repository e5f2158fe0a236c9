from skiplock.cli import main

raise SystemExit(main())
