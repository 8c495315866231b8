"""The items of trnf's CORE format sample, written by hand for the project (see
build_core_sample_bundle.py). Each task mirrors the structure of a real CORE task; the
text is about Python, which the project's offline corpus (Python's documentation) covers.
A score on them means nothing: they exist to exercise the format and the engine.
"""

from __future__ import annotations

from typing import Any


def mc(query: str, choices: list[str], gold: int) -> dict[str, Any]:
    return {"query": query, "choices": choices, "gold": gold}


def schema(options: list[str], continuation: str, gold: int) -> dict[str, Any]:
    return {"context_options": options, "continuation": continuation, "gold": gold}


def lm(context: str, continuation: str) -> dict[str, Any]:
    return {"context": context, "continuation": continuation}


def question(text: str) -> str:
    return f"Question: {text}\nAnswer:"


# Like arc_easy: a question, short answers, zero-shot.
PYTHON_FACTS = [
    mc(question("Which keyword starts a function definition in Python?"), ["def", "class", "return", "import"], 0),
    mc(question("Which built-in function returns the number of items in a list?"), ["sum", "len", "max", "print"], 1),
    mc(question("What does a function return when it has no return statement?"), ["zero", "an empty string", "None", "True"], 2),
    mc(question("Which keyword catches an exception?"), ["catch", "rescue", "handle", "except"], 3),
    mc(question("What type does the expression 3 / 2 produce in Python 3?"), ["a float", "an integer", "a string", "a list"], 0),
    mc(question("Which method adds one item to the end of a list?"), ["push", "append", "extend_one", "put"], 1),
    mc(question("Which statement leaves the innermost loop at once?"), ["continue", "pass", "break", "yield"], 2),
    mc(question("What does the pass statement do?"), ["it ends the program", "it skips a function", "it raises an error", "nothing"], 3),
    mc(question("Which standard module provides regular expressions?"), ["re", "os", "sys", "math"], 0),
    mc(question("Which of these built-in types is immutable?"), ["list", "tuple", "dict", "set"], 1),
    mc(question("Which operator gives the remainder of a division?"), ["//", "**", "%", "&"], 2),
    mc(question("Which built-in function opens a file?"), ["file", "read", "load", "open"], 3),
    mc(question("Which keyword creates a small anonymous function?"), ["lambda", "def", "func", "anon"], 0),
    mc(question("Which function turns the string '42' into a number?"), ["str", "int", "chr", "repr"], 1),
    mc(question("What is the index of the first item of a list?"), ["one", "minus one", "zero", "ten"], 2),
    mc(question("Which keyword defines a class?"), ["object", "type", "struct", "class"], 3),
    mc(question("Which built-in returns a new sorted list?"), ["sorted", "sort", "order", "arrange"], 0),
    mc(question("Which statement checks a condition while debugging?"), ["ensure", "assert", "check", "verify"], 1),
    mc(question("Which keyword makes a function a generator?"), ["await", "async", "yield", "return"], 2),
    mc(question("Which module gives access to the command line arguments?"), ["math", "json", "time", "sys"], 3),
]

# Like hellaswag: the start of a sentence and four endings, three shots.
DOC_COMPLETION = [
    mc("To read a text file line by line, you open it and", ["iterate over the file object.", "paint the file blue.", "ask the file to sing.", "unplug the keyboard."], 0),
    mc("When a dictionary lookup uses a key that is not present,", ["the computer turns off.", "a KeyError is raised.", "the key becomes a list.", "Python prints a poem."], 1),
    mc("A virtual environment keeps the packages of one project", ["inside the monitor.", "in the clouds above.", "separate from those of other projects.", "in a drawer."], 2),
    mc("A for loop over a range of numbers", ["melts the numbers.", "prints the alphabet.", "deletes the range.", "runs its body once for each number."], 3),
    mc("To sort a list in place, you call", ["its sort method.", "a taxi.", "the list by name.", "the sorted keyboard."], 0),
    mc("A function that calls itself is", ["broken.", "called recursive.", "a loop variable.", "a syntax error."], 1),
    mc("Comments in Python start with", ["a semicolon.", "the word comment.", "a hash sign.", "a dollar sign."], 2),
    mc("When two strings are joined with the plus operator,", ["they are deleted.", "an integer results.", "the program stops.", "a new string holds both."], 3),
    mc("The with statement closes the file", ["when its block ends.", "before it opens.", "every second.", "only on Mondays."], 0),
    mc("A list comprehension builds a new list", ["from a picture.", "from an expression and a loop.", "by asking the user.", "out of thin air."], 1),
    mc("Indentation in Python", ["is ignored.", "is only decoration.", "marks where a block begins and ends.", "makes code slower."], 2),
    mc("The help function shows", ["the weather.", "a random number.", "the current time.", "the documentation of an object."], 3),
    mc("Dividing by zero in Python", ["raises a ZeroDivisionError.", "returns infinity silently.", "prints a smile.", "restarts the machine."], 0),
    mc("A module is imported once, and later imports", ["fail.", "reuse the loaded module.", "delete it.", "copy the file."], 1),
    mc("Keyword arguments are passed to a function", ["by shouting.", "in a separate file.", "by name.", "upside down."], 2),
    mc("A set removes duplicates because", ["it is sorted.", "it is slow.", "it is a string.", "each element appears at most once."], 3),
    mc("The print function writes its arguments", ["to standard output.", "to the printer only.", "backwards.", "into the source code."], 0),
    mc("A tuple is written with its items", ["in square brackets.", "between parentheses.", "in a separate module.", "on separate machines."], 1),
    mc("An exception that nobody catches", ["is ignored.", "becomes a warning.", "ends the program with a traceback.", "turns into None."], 2),
    mc("Strings in Python can be written with", ["only numbers.", "curly braces.", "angle brackets.", "single or double quotes."], 3),
]

# Like winograd: the options differ in what a pronoun would refer to.
PRONOUN_SCHEMA = [
    schema(["The parser rejected the file because the parser", "The parser rejected the file because the file"], "was malformed.", 1),
    schema(["The test failed on the server but not on the laptop because the server", "The test failed on the server but not on the laptop because the laptop"], "had an older version of Python.", 0),
    schema(["The script could not read the list because the script", "The script could not read the list because the list"], "was empty.", 1),
    schema(["The student asked the teacher about decorators because the student", "The student asked the teacher about decorators because the teacher"], "did not understand them.", 0),
    schema(["The cache was faster than the database because the cache", "The cache was faster than the database because the database"], "kept everything in memory.", 0),
    schema(["The function could not find the variable because the function", "The function could not find the variable because the variable"], "was defined in another module.", 1),
    schema(["The reviewer praised the patch because the reviewer", "The reviewer praised the patch because the patch"], "was short and clear.", 1),
    schema(["The laptop ran the job slower than the server because the laptop", "The laptop ran the job slower than the server because the server"], "had fewer cores.", 0),
    schema(["The program crashed when the file was missing because the program", "The program crashed when the file was missing because the file"], "did not check for it.", 0),
    schema(["The loop never ended because the loop", "The loop never ended because the counter"], "was never increased.", 1),
    schema(["The library replaced the old function because the library", "The library replaced the old function because the old function"], "was too slow.", 1),
    schema(["The user trusted the tool because the user", "The user trusted the tool because the tool"], "always gave the same answer.", 1),
    schema(["The new version broke the plugin because the new version", "The new version broke the plugin because the plugin"], "relied on a removed feature.", 1),
    schema(["The team chose Python over C because the team", "The team chose Python over C because C"], "wanted to write the tool quickly.", 0),
    schema(["The string did not match the pattern because the string", "The string did not match the pattern because the pattern"], "had a typo in it.", 1),
    schema(["The teacher gave the student a book because the teacher", "The teacher gave the student a book because the student"], "wanted to learn more.", 1),
]

# Like winogrande: a blank filled with one of two names, two shots.
BLANK_SCHEMA = [
    schema(["Anna gave her old laptop to Maria because Anna", "Anna gave her old laptop to Maria because Maria"], "had bought a new one.", 0),
    schema(["Tom fixed the bug faster than Sam because Tom", "Tom fixed the bug faster than Sam because Sam"], "had written the code.", 0),
    schema(["The tutorial helped Ravi more than Lena because Ravi", "The tutorial helped Ravi more than Lena because Lena"], "already knew the basics.", 1),
    schema(["Kim asked Joe to review the code because Kim", "Kim asked Joe to review the code because Joe"], "was the expert on it.", 1),
    schema(["Ella finished the course before Ben because Ella", "Ella finished the course before Ben because Ben"], "started a month later.", 1),
    schema(["Omar lent his book to Pia since Omar", "Omar lent his book to Pia since Pia"], "had lost her copy.", 1),
    schema(["Lucy explained generators to Mark because Lucy", "Lucy explained generators to Mark because Mark"], "had used them for years.", 0),
    schema(["The server was replaced by the cluster because the server", "The server was replaced by the cluster because the cluster"], "could no longer keep up.", 0),
    schema(["Nina won the contest against Paul because Nina", "Nina won the contest against Paul because Paul"], "made a mistake at the end.", 1),
    schema(["Ivan could not run the script but Sara could because Ivan", "Ivan could not run the script but Sara could because Sara"], "had the right version installed.", 1),
    schema(["Leo taught Mia to write tests since Leo", "Leo taught Mia to write tests since Mia"], "was new to the project.", 1),
    schema(["Grace answered every question from Hugo because Grace", "Grace answered every question from Hugo because Hugo"], "knew the library well.", 0),
    schema(["The old script was slower than the new one because the old script", "The old script was slower than the new one because the new one"], "read the file twice.", 0),
    schema(["Zoe thanked Adam for the fix because Zoe", "Zoe thanked Adam for the fix because Adam"], "had been stuck for days.", 0),
    schema(["Max borrowed a charger from Ida because Max", "Max borrowed a charger from Ida because Ida"], "had forgotten his own.", 0),
    schema(["Ruth corrected the report written by Carl because Ruth", "Ruth corrected the report written by Carl because Carl"], "made several errors.", 1),
]

# Like lambada: a passage whose last word the model must predict.
LAST_WORD = [
    lm("A list can grow and shrink, and its items can be replaced. A tuple cannot be changed once it is created, which is why tuples are called", "immutable"),
    lm("Before you can use a function from another module, you have to bring that module into your program with the keyword", "import"),
    lm("When a program reads input that it cannot handle, it raises an error. To keep running, the program wraps the risky code in a try statement with an except", "clause"),
    lm("Every value in Python has a type. You can ask for the type of any value by calling the built-in function named", "type"),
    lm("A dictionary maps keys to values. To look up a value, you write the name of the dictionary followed by the key in square", "brackets"),
    lm("The interpreter reads a source file from top to bottom and runs each statement in", "order"),
    lm("To repeat a block of code while a condition holds, you write the keyword", "while"),
    lm("Strings are sequences of characters. To know how many characters a string has, you pass it to the function", "len"),
    lm("A class describes how its objects behave. Each object made from a class is called an", "instance"),
    lm("When a function needs information from its caller, the caller passes it in as", "arguments"),
    lm("The standard library has a module for dates and times. Its name is", "datetime"),
    lm("Code that is shared between many programs is often collected into a", "library"),
    lm("To write text to a file, you open the file in write", "mode"),
    lm("A variable that is defined inside a function can only be used inside that", "function"),
    lm("The first line of a function can be a string that explains what the function does. This string is called a", "docstring"),
    lm("When you divide two integers with a double slash, the result is rounded down to a whole", "number"),
    lm("The keyword that gives a value back from a function to its caller is", "return"),
    lm("Python programs are usually saved in files whose names end with the letters", "py"),
    lm("To run the same code for every item in a list, you use a for", "loop"),
    lm("A program that translates and runs Python code line by line is called an", "interpreter"),
]

# Like squad: a passage and a question, answered after a delimiter; three shots.
DOC_QA = [
    lm("Context: The len function returns the number of items in a container.\nQuestion: What does len return?", "the number of items in a container"),
    lm("Context: A tuple is an immutable sequence, usually written with parentheses.\nQuestion: Can a tuple be changed after it is created?", "no"),
    lm("Context: The os module provides functions for working with files and directories.\nQuestion: Which module works with files and directories?", "os"),
    lm("Context: The range function produces a sequence of integers, starting at zero by default.\nQuestion: Where does range start by default?", "zero"),
    lm("Context: A set holds unique elements and has no order.\nQuestion: Can a set hold the same element twice?", "no"),
    lm("Context: The json module reads and writes JSON text.\nQuestion: Which module reads JSON text?", "json"),
    lm("Context: Methods are functions defined inside a class.\nQuestion: Where are methods defined?", "inside a class"),
    lm("Context: The break statement ends the innermost loop.\nQuestion: Which statement ends the innermost loop?", "break"),
    lm("Context: Python was created by Guido van Rossum and first released in 1991.\nQuestion: Who created Python?", "Guido van Rossum"),
    lm("Context: A KeyError is raised when a dictionary has no entry for a key.\nQuestion: Which error is raised for a missing dictionary key?", "KeyError"),
    lm("Context: The pip tool installs packages from the Python Package Index.\nQuestion: Which tool installs packages?", "pip"),
    lm("Context: Lists are written with square brackets, dictionaries with curly braces.\nQuestion: How are lists written?", "with square brackets"),
    lm("Context: The math module provides sqrt, which returns a square root.\nQuestion: Which function returns a square root?", "sqrt"),
    lm("Context: An f-string starts with the letter f before its opening quote.\nQuestion: Which letter starts an f-string?", "f"),
    lm("Context: The time module's sleep function pauses a program for a number of seconds.\nQuestion: What does sleep do?", "pauses a program"),
    lm("Context: Indentation defines blocks in Python; four spaces are the usual step.\nQuestion: How many spaces are the usual indentation step?", "four"),
    lm("Context: None is the value of a function that returns nothing.\nQuestion: What does a function without a return statement give back?", "None"),
    lm("Context: The random module chooses numbers and items at random.\nQuestion: Which module chooses items at random?", "random"),
    lm("Context: Comments begin with a hash sign and run to the end of the line.\nQuestion: What does a comment begin with?", "a hash sign"),
    lm("Context: The input function reads a line of text typed by the user.\nQuestion: Which function reads a line typed by the user?", "input"),
]

# label -> (folder, items, type, shots, delimiter or None, random baseline, category, what it mirrors)
TASKS: dict[str, tuple[str, list[dict[str, Any]], str, int, str | None, float, str, str]] = {
    "sample_python_facts": ("world_knowledge", PYTHON_FACTS, "multiple_choice", 0, None, 25.0, "world knowledge", "arc_easy"),
    "sample_doc_completion": ("language_understanding", DOC_COMPLETION, "multiple_choice", 3, None, 25.0, "language understanding", "hellaswag"),
    "sample_pronoun_schema": ("language_understanding", PRONOUN_SCHEMA, "schema", 0, None, 50.0, "language understanding", "winograd"),
    "sample_blank_schema": ("commonsense_reasoning", BLANK_SCHEMA, "schema", 2, None, 50.0, "commonsense reasoning", "winogrande"),
    "sample_last_word": ("language_understanding", LAST_WORD, "language_modeling", 0, None, 0.0, "language understanding", "lambada_openai"),
    "sample_doc_qa": ("reading_comprehension", DOC_QA, "language_modeling", 3, "\nAnswer: ", 0.0, "reading comprehension", "squad"),
}
