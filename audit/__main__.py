from audit.cli import main

raise SystemExit(main())
