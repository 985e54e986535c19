from cometnmt.cli import main

raise SystemExit(main())
